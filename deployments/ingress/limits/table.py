"""The limits file as an ingress replica reads it: which key is whose (`KeyTable.identify`), the
named keys it accepts, and reloads of the file.

The file is looked at again at most once a second, when a request comes (a `stat`; the file is read
only when its size or time changed). An edit takes effect for the next request; an edit that does
not parse, or that names an unset `key_env`, is refused with one log line and the limits before it
stay. Where the file is not on this node (a replica on another node of a cluster) the limits the
builder read are kept, and the log says that edits are not seen there.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from deployments.config.limits import DEFAULT_NAME, KeyLimits, LimitsFile, NamedKey, parse_limits
from deployments.errors import ConfigError
from deployments.ingress.limits.ledger import Caps
from deployments.protocol.replica import Tenant

logger = logging.getLogger("ray.serve")

CHECK_EVERY_S = 1.0
QUEUE_DIGEST_BYTES = 8  # a default-entry key's own queue and buckets: 64 bits of its digest, no two keys alike


@dataclass(frozen=True)
class KeyIdentity:
    """A caller as the limits see it: its entry's name and limits, and its own `queue`: its
    fair-queueing tenant and its buckets at the board (keys of the default entry each have their
    own, of the default's size: `default:<the first 8 bytes of the key's digest>`). The metrics name
    the entry (`name`: their label values stay bounded).
    """

    name: str
    queue: str
    limits: KeyLimits

    @property
    def caps(self) -> Caps:
        return Caps(self.limits.requests_per_minute, self.limits.tokens_per_minute, self.limits.max_concurrent)

    @property
    def bucket(self) -> str:
        """The name its requests and tokens are counted under at the board: its own."""
        return self.queue

    @property
    def tenant(self) -> Tenant:
        return Tenant(name=self.name, queue=self.queue, priority=self.limits.priority, share=self.limits.max_slot_share)

    def allows(self, model: str) -> bool:
        """Whether the key may use `model`: a listed name, or an adapter of a listed base name."""
        allowed = self.limits.models
        if allowed is None:
            return True
        return model in allowed or model.partition(":")[0] in allowed


@dataclass(frozen=True)
class _Loaded:
    limits: LimitsFile
    named: dict[bytes, NamedKey]  # by the key's SHA-256 digest


class KeyTable:
    """The replica's current limits, from `path` (None: the builder's `parsed` only)."""

    def __init__(self, parsed: LimitsFile, path: str | None, environ: Mapping[str, str] = os.environ) -> None:
        self._environ = environ
        self._path = Path(path) if path else None
        self._stamp: tuple[int, int] | None = None
        self._checked = time.monotonic()
        self._loaded = _Loaded(parsed, parsed.digests(environ))
        if self._path is not None:
            try:
                self._stamp = _stamp(self._path)
            except OSError:
                logger.warning(
                    "limits file %s is not on this node: the limits read when the app was built apply, and edits "
                    "are not seen here",
                    self._path,
                )
                self._path = None
        logger.info("limits: %s", self.describe())

    def describe(self) -> str:
        limits = self._loaded.limits
        default = limits.default.model_dump(exclude_defaults=True) or "unlimited"
        return (
            f"{len(limits.keys)} named key(s) ({', '.join(k.name for k in limits.keys) or 'none'}); default {default}"
        )

    @property
    def digests(self) -> list[bytes]:
        """The named keys' digests: keys the guard accepts."""
        return list(self._current().named)

    def identify(self, digest: bytes | None) -> KeyIdentity:
        """The caller with key digest `digest` (None: no keys are set, the one anonymous caller)."""
        loaded = self._current()
        named = loaded.named.get(digest) if digest is not None else None
        if named is not None:
            return KeyIdentity(named.name, named.name, named)
        queue = DEFAULT_NAME if digest is None else f"{DEFAULT_NAME}:{digest[:QUEUE_DIGEST_BYTES].hex()}"
        return KeyIdentity(DEFAULT_NAME, queue, loaded.limits.default)

    def named(self, name: str, queue: str) -> KeyIdentity:
        """The key that the limits called `name` (with its own `queue`) when it made a batch, under
        the limits of now: its entry's, or the default's when it has none (any more).
        """
        loaded = self._current()
        named = next((key for key in loaded.named.values() if key.name == name), None)
        if named is not None:
            return KeyIdentity(named.name, named.name, named)
        return KeyIdentity(DEFAULT_NAME, queue, loaded.limits.default)

    def _current(self) -> _Loaded:
        now = time.monotonic()
        if self._path is not None and now - self._checked >= CHECK_EVERY_S:
            self._checked = now
            self._reload(self._path)
        return self._loaded

    def _reload(self, path: Path) -> None:
        try:
            stamp = _stamp(path)
            if stamp == self._stamp:
                return
            self._stamp = stamp
            parsed = parse_limits(path.read_text(), str(path))
            self._loaded = _Loaded(parsed, parsed.digests(self._environ))
        except (OSError, ConfigError) as exc:
            logger.error("limits file %s: edit refused, the limits before it stay: %s", path, exc)
            return
        logger.info("limits file %s reloaded: %s", path, self.describe())


def _stamp(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_mtime_ns, stat.st_size
