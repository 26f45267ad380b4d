"""The recorded request bodies of the two agent CLIs (`agent_bodies/`: Codex CLI 0.171.0's first
request to /v1/responses and Claude Code 2.1.332's to /v1/messages?beta=true, captured from the CLIs
installed from npm by a local HTTP server on 2026-11-27, ids, paths and times replaced; and Claude
Code's turn after a Read of a local PDF, `claude_code_pdf`, captured on 2026-11-28 from a capture
server that answered its first request with that Read), for the unit and Serve tests that replay them."""

from __future__ import annotations

import copy
import inspect
import json
from pathlib import Path
from typing import Any

BODIES = Path(__file__).parent / "agent_bodies"


def recorded(name: str) -> dict[str, Any]:
    """`codex_responses`, `claude_code_messages` or `claude_code_pdf`: the file's `body` (and `betas`, for Claude
    Code's `anthropic-beta` flags), a fresh copy each time."""
    return copy.deepcopy(json.loads((BODIES / f"{name}.json").read_text()))


def claude_code_call(body: dict[str, Any]) -> dict[str, Any]:
    """Claude Code's body as keyword arguments of the anthropic client's `beta.messages.create`, which
    posts to /v1/messages?beta=true with the `anthropic-beta` header, as the CLI does."""
    return {**body["body"], "betas": body["betas"], "extra_query": {"beta": "true"}}


def codex_call(body: dict[str, Any], create: Any) -> dict[str, Any]:
    """Codex's body as keyword arguments of the openai client's `responses.create` (`create`): the
    fields the client does not declare (`client_metadata`) go in `extra_body`, sent as they are."""
    known = inspect.signature(create).parameters
    extra = {key: value for key, value in body.items() if key not in known}
    return {**{key: value for key, value in body.items() if key in known}, "extra_body": extra}
