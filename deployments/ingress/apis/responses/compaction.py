"""/v1/responses/compact for models of any size: the model reads the conversation as a transcript
and writes a summary of it (`summary_request`), and the compaction is the conversation's user
messages, kept word for word, then one `compaction` item whose `encrypted_content` is that summary
in plain text (`compacted_output`). Sent back as input, the item is an assistant message that gives
the summary (`items.chat_messages`), so a small model continues from a short context of the user's
own words and its summary of the rest, with no hidden state on the server.

A transcript in one user turn, rather than the chat itself followed by an instruction, is what a
small model summarizes well: it reads the conversation as text to summarize, not as a dialogue to
go on with.

The endpoint's wire (`CompactRequest`, `CompactedResponse`) is in `protocol/openai/response_object.py`.
"""

from __future__ import annotations

from typing import Any

from deployments.ingress.apis.responses.items import SUMMARY_INTRO, Item, stored_item
from deployments.protocol.openai.items import (
    CompactionItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputFile,
    InputImage,
    MessageItem,
    item_id,
)
from deployments.protocol.replica import GenerateRequest, TextMessage

SUMMARY_MAX_TOKENS = 256
SUMMARY_SYSTEM = "You write short, faithful summaries of conversations."
SUMMARY_TASK = (
    "Summarize the conversation below in a few sentences, so that it can be continued later. "
    "Keep every fact, name, number, decision and code word it contains."
)


def transcript(instructions: str | None, items: list[Item]) -> str:
    """The conversation as text: one line per turn, images named, not shown."""
    lines = [f"Instructions: {instructions}"] if instructions else []
    for item in items:
        if isinstance(item, MessageItem):
            lines.append(f"{'User' if item.role == 'user' else item.role.capitalize()}: {_text(item.content)}")
        elif isinstance(item, FunctionCallItem):
            lines.append(f"Assistant called the tool {item.name} with {item.arguments}")
        elif isinstance(item, FunctionCallOutputItem):
            lines.append(f"Tool result: {_text(item.output)}")
        elif isinstance(item, CompactionItem):
            lines.append(f"Assistant: {SUMMARY_INTRO} {item.encrypted_content}")
    return "\n".join(lines)


def _text(content: str | list[Any]) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if isinstance(part, InputImage):
            parts.append("[an image]")
        elif isinstance(part, InputFile):
            parts.append(f"[a document: {part.filename or 'unnamed'}]")
        else:
            parts.append(part.refusal if part.type == "refusal" else part.text)
    return " ".join(parts)


def summary_request(instructions: str | None, items: list[Item]) -> GenerateRequest:
    """The decoder's request for the summary: greedy, at most `SUMMARY_MAX_TOKENS` tokens."""
    messages = [
        TextMessage(role="system", content=SUMMARY_SYSTEM),
        TextMessage(role="user", content=f"{SUMMARY_TASK}\n\n{transcript(instructions, items)}"),
    ]
    return GenerateRequest(messages=messages, max_tokens=SUMMARY_MAX_TOKENS, temperature=0)


def compacted_output(items: list[Item], summary: str) -> list[dict[str, Any]]:
    """The conversation's user messages as they came (with ids and `status`), then the summary."""
    kept = [
        {**stored_item(item), "status": "completed"}
        for item in items
        if isinstance(item, MessageItem) and item.role == "user"
    ]
    return [*kept, {"type": "compaction", "id": item_id("cmp"), "encrypted_content": summary.strip()}]
