"""A decoder request's prefix as block hashes: what the router matches and the replica reports.

The key is what the engine will read, in the order its chat template renders it: the adapter first
(a prefix under one LoRA adapter is not another's, nor the base model's), then the tools (templates
render them in the system turn), then each message (role, text, tool calls, the id a tool message
answers; native vision: each image as its SHA-256, in place), or a completion's prompt. Captions and
documents have already replaced images and files in the `GenerateRequest` the ingress sends, so
proxy vision is keyed on the captions the engine reads.

That text is cut into `BLOCK_CHARS`-character blocks, and each full block's hash chains the one
before (as vLLM and llm-d key KV blocks): block i's hash names the whole prefix up to its end, so a
match is a walk from the first block that stops at the first miss, bounded in memory by the number
of blocks kept, never by the prompts' length. The trailing partial block is not keyed: a prompt
shorter than one block never matches (it costs little to read again).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator

from deployments.protocol.replica import GenerateRequest, TextMessage

BLOCK_CHARS = 256  # about 64 tokens of English: a 1,900-token prompt is about 30 blocks
MAX_BLOCKS = 4096  # a prompt's first ~1M characters are keyed; the rest cannot change where it goes

# Separators that chat text rarely holds (ASCII's record, unit and group separators), so that two
# different chats do not serialize alike.
_MESSAGE, _FIELD, _IMAGE = "\x1e", "\x1f", "\x1d"


def serialize(request: GenerateRequest) -> str:
    """The request's prompt as the engine reads it, in a canonical text form (not the template's)."""
    return "".join(_pieces(request))


def _pieces(request: GenerateRequest) -> Iterator[str]:
    if request.tools:
        yield "tools" + _FIELD + json.dumps(request.tools, sort_keys=True, separators=(",", ":"))
    for message in request.messages:
        yield _message(message, request)
    if request.prompt is not None:
        prompt = request.prompt
        yield _MESSAGE + "prompt" + _FIELD + (prompt if isinstance(prompt, str) else ",".join(map(str, prompt)))


def _message(message: TextMessage, request: GenerateRequest) -> str:
    if message.parts:
        body = "".join(
            part.text
            if part.type == "text"
            else _IMAGE + (request.images[part.index].sha256 if part.index < len(request.images) else "?") + _IMAGE
            for part in message.parts
        )
    else:
        body = message.content
    text = _MESSAGE + message.role + _FIELD + body
    if message.tool_calls:
        text += _FIELD + json.dumps([c.model_dump(mode="json") for c in message.tool_calls], sort_keys=True)
    if message.tool_call_id:
        text += _FIELD + message.tool_call_id
    return text


def _seed(adapter: str | None) -> bytes:
    return hashlib.blake2b((adapter or "").encode(), digest_size=8).digest()


def block_hashes(text: str, adapter: str | None = None) -> tuple[int, ...]:
    """The chained hashes of `text`'s full blocks under `adapter` (None: the base model), as unsigned
    64-bit integers: `h[i]` is the hash of `h[i-1]` and block i (`h[-1]`: the adapter's).
    """
    previous, hashes = _seed(adapter), []
    for start in range(0, min(len(text), MAX_BLOCKS * BLOCK_CHARS) - BLOCK_CHARS + 1, BLOCK_CHARS):
        previous = hashlib.blake2b(
            previous + text[start : start + BLOCK_CHARS].encode("utf-8", "surrogatepass"), digest_size=8
        ).digest()
        hashes.append(int.from_bytes(previous, "big"))
    return tuple(hashes)


def prefix_blocks(request: GenerateRequest, adapter: str | None = None) -> tuple[int, ...]:
    """The request's block hashes under `adapter` (the multiplexed model id; None or "": the base
    model). The router and the decoder replica compute the same ones.
    """
    return block_hashes(serialize(request), adapter or None)
