"""How a request becomes a transformers prompt: a chat in the chat-template convention (assistant
tool calls, tool answers), a request's `tools` (a 400 when the template does not render them), and a
legacy completion's prompt taken as it is. Shared by the text decoders and the native VLM."""

from __future__ import annotations

import json
from typing import Any

from deployments.errors import InvalidRequestError
from deployments.protocol.payloads import TextMessage

_TOOL_PROBE = "mmserve_tool_probe"


def template_message(message: TextMessage) -> dict[str, Any]:
    """A message in transformers' chat-template convention: an assistant's `tool_calls` as
    `{"type": "function", "function": {"name", "arguments": <dict>}}` (templates render the
    arguments with `tojson` or iterate them), a tool answer with its `tool_call_id`."""
    rendered: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        rendered["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": _arguments(call.function.arguments)},
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        rendered["tool_call_id"] = message.tool_call_id
    return rendered


def _arguments(text: str) -> Any:
    """OpenAI's arguments (JSON text) as the object templates expect; text that is no JSON object stays text."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    return value if isinstance(value, dict) else text


def template_tools(tools: list[dict[str, Any]] | None, supported: bool) -> dict[str, Any]:
    """`apply_chat_template`'s arguments for a request's `tools`; a 400 when the model's template
    does not render them (`template_supports_tools`)."""
    if not tools:
        return {}
    if not supported:
        raise InvalidRequestError(
            "This model's chat template does not support tools; send the request without `tools`.", param="tools"
        )
    return {"tools": tools}


def template_supports_tools(tokenizer: Any) -> bool:
    """Whether the chat template renders a tool list: a probe tool's name must appear in the prompt
    (SmolLM2's template never reads `tools`, so a tool list would vanish silently)."""
    parameters = {"type": "object", "properties": {"x": {"type": "string", "description": "x"}}, "required": ["x"]}
    probe = [{"type": "function", "function": {"name": _TOOL_PROBE, "description": "probe", "parameters": parameters}}]
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}], tools=probe, tokenize=False, add_generation_prompt=True
        )
    except Exception:  # a template that fails on tools does not support them
        return False
    return _TOOL_PROBE in str(text)


def raw_prompt_ids(tokenizer: Any, prompt: str | list[int], vocab_size: int) -> list[int]:
    """A legacy completion's prompt as it is: text tokenized with the tokenizer's own special tokens
    (e.g. a BOS where it adds one), token ids checked against the vocabulary."""
    ids = list(tokenizer(prompt).input_ids) if isinstance(prompt, str) else list(prompt)
    if not ids:
        raise InvalidRequestError("The prompt is empty.", param="prompt")
    if isinstance(prompt, list) and (bad := sorted({t for t in ids if not 0 <= t < vocab_size})):
        raise InvalidRequestError(
            f"The prompt has token ids outside the vocabulary (0 to {vocab_size - 1}): {bad[:5]}",
            param="prompt",
        )
    return ids
