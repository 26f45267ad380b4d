"""Who stored state belongs to: the rule that every store of the service applies (the responses
store; the files and batches, through `records.py`; the conversations, through the same records).

With API keys set, each request is made by the key it presented (`Caller`, set by the guard as a
SHA-256 digest, never the key). A store keeps beside each thing it stores the owner's tag: an
HMAC-SHA256 of that digest under a secret of the store's own (`Owners`), so that neither the key
nor a digest that could be checked against guessed keys is kept. A thing is found only by a caller
with the same tag; to any other caller it does not exist: the same 404 as an unknown id, with
nothing in the body or the headers that tells the two apart. The refusal is logged by the ingress
with the request's id, never the owner.

With no keys set every caller is the same anonymous one, and everything stored is everyone's (as
before keys existed). Keys rotated: a thing stored under a removed key is unreachable, never
reassigned; one stored with no keys set is not reached by a key, nor one stored by a key with
no keys set.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

logger = logging.getLogger("ray.serve")

STATE_KEY = "mmserve_caller_key"  # the request's `state` entry the guard sets: the key's digest
T = TypeVar("T")


@dataclass(frozen=True)
class Caller:
    """Who asks a store: the SHA-256 digest of the API key the request presented (None when no keys
    are set), and the request's id, for the log line of a refusal.
    """

    key_digest: bytes | None = None
    request_id: str = "unknown"


def caller_of(state: Any, request_id: str) -> Caller:
    """The caller of a request or WebSocket (Starlette's `state`, as the guard left it)."""
    digest = getattr(state, STATE_KEY, None)
    return Caller(digest if isinstance(digest, bytes) else None, request_id)


class Owners:
    """A store's owner tags, under its own secret (random: a new store starts empty, so the tags of a
    store that was lost mean nothing).
    """

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret or secrets.token_bytes(32)

    def tag(self, caller: Caller) -> str | None:
        """The tag to keep beside what `caller` stores (None: no keys set)."""
        if caller.key_digest is None:
            return None
        return hmac.new(self._secret, caller.key_digest, hashlib.sha256).hexdigest()

    def owns(self, tag: str | None, caller: Caller) -> bool:
        """Whether `caller` owns a thing kept with `tag`."""
        mine = self.tag(caller)
        if tag is None or mine is None:
            return tag is None and mine is None
        return hmac.compare_digest(tag, mine)


@dataclass(frozen=True)
class Found(Generic[T]):
    """What a store found for a caller: the thing (None: not found for this caller), and whether a thing
    was there but another owner's (`foreign`: for the log line, never for the answer).
    """

    thing: T | None = None
    foreign: bool = False


def refused(kind: str, thing_id: str, caller: Caller) -> None:
    """Log a refused access to another owner's `kind` (answered as not found): the request's id, the
    thing's, never the owner.
    """
    logger.warning(
        "request %s: %s %r belongs to another API key; answered as not found", caller.request_id, kind, thing_id
    )
