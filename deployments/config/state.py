"""Where the service keeps what outlives a request, and its bounds: the ``server.state:`` section of
models.yaml (files, batches, stored responses and conversations, `deployments/state/`).
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import Field

from deployments.config.strict import StrictModel

logger = logging.getLogger("ray.serve")

DAY_S = 24 * 3600


class StateConfig(StrictModel):
    """The storage root that every ingress replica and the batch runner share, and the bounds of stored
    responses and conversations (files' and batches' are ``server.batches``).
    """

    storage_root: str = Field(
        "$XDG_STATE_HOME/mmserve/storage",
        description="Where files, batches, stored responses and conversations are kept: a local directory (a "
        "shared path on a multi-node cluster, so that every ingress replica reads what another wrote), or an "
        "`s3://` / `gs://` URI read and written through `pyarrow.fs` (pyarrow must then be installed). A leading "
        "`$XDG_STATE_HOME` is that variable, or `~/.local/state` where it is unset (read when the storage opens, "
        "as is `~`). A local directory is private to the service's user: made 0700 (its files 0600); one that "
        "belongs to another user, is writable by others or is a symbolic link is refused at start.",
    )
    responses_max_bytes: int = Field(
        1024**3,
        ge=0,
        description="Most bytes of stored responses (`store: true` on /v1/responses, each with the conversation "
        "it continued) kept in the storage root, all keys together; past it the oldest go first. 0 keeps none.",
    )
    responses_max_age_s: float = Field(
        30 * DAY_S,
        gt=0,
        description="How long a stored response is kept (OpenAI keeps them 30 days); after it, continuing it or "
        "getting it is `previous_response_not_found` (400) or 404.",
    )
    conversation_max_bytes: int = Field(
        64 * 1024**2,
        gt=0,
        description="Most bytes of items one conversation (/v1/conversations) keeps: adding items past it is a "
        "400, and so is a /v1/responses turn on a conversation already past it (a turn that starts within it "
        "adds its items whole). Conversations are kept until deleted, as OpenAI keeps them.",
    )
    conversations_max_per_key: int = Field(
        10_000,
        gt=0,
        description="Most conversations an API key keeps (all callers together when no keys are set); creating "
        "one more is refused with a 400, as OpenAI refuses a file past its storage quota. Deleting a "
        "conversation frees its place.",
    )
    conversations_max_bytes_per_key: int = Field(
        1024**3,
        gt=0,
        description="Most bytes of conversation items an API key keeps over all its conversations (their logs "
        "as stored, deletion records included; all callers together when no keys are set): an add that would "
        "pass it is a 400, and so is a /v1/responses turn on a conversation of a key already past it (a turn "
        "that starts within it adds its items whole). Deleting a conversation frees its bytes. Each ingress "
        "replica counts its own writes at once, and the other replicas' within 10 seconds.",
    )


# Settings of earlier releases, read into `server.state` (with a warning naming the new place).
_MOVED = {("batches", "storage_root"): "storage_root", ("responses_max_age_s",): "responses_max_age_s"}
_DROPPED = {"responses_max_entries": "stored responses are bounded by bytes: server.state.responses_max_bytes"}


def moved_settings(server: Any) -> Any:
    """A `server:` mapping with the settings of earlier releases moved into its `state:` section."""
    if not isinstance(server, dict):
        return server
    server = dict(server)
    state = dict(server.get("state") or {})
    for path, name in _MOVED.items():
        parent = server if len(path) == 1 else server.get(path[0])
        if isinstance(parent, dict) and path[-1] in parent:
            if len(path) > 1:
                parent = server[path[0]] = dict(parent)
            value = parent.pop(path[-1])
            state.setdefault(name, value)
            logger.warning("models.yaml: server.%s is now server.state.%s (read there)", ".".join(path), name)
    if server.get("responses_max_entries") == 0:  # it kept none: so do the bytes
        state.setdefault("responses_max_bytes", 0)
    for name, why in _DROPPED.items():
        if name in server:
            server.pop(name)
            logger.warning("models.yaml: server.%s is no longer read: %s", name, why)
    if state:
        server["state"] = state
    return server
