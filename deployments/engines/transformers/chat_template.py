"""How a request becomes a transformers prompt: a chat in the chat-template convention (assistant
tool calls, tool answers), a request's `tools` as the model's tool-call format has them
(`ToolRendering`: the template renders them, or the generic format's prompt, `tools.prompt`), and a
legacy completion's prompt taken as it is. Shared by the text decoders and the native VLM.

The format (`capabilities.tool_call_format`) is resolved once at load (`resolve_tool_rendering`):
`auto` reads the template: one that renders a probe tool is the family whose call syntax it contains
(`tools.prompt.detect_tool_format`), else generic.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from deployments.config import ToolCallFormat
from deployments.engines.tokens import check_token_ids
from deployments.errors import InvalidRequestError
from deployments.tools.formats import TOOL_MARKERS
from deployments.tools.prompt import generic_chat, resolve_tool_format

logger = logging.getLogger("ray.serve")

_TOOL_PROBE = "mmserve_tool_probe"
_SYSTEM_PROBE = "mmserve_system_probe"


@dataclass(frozen=True)
class ToolRendering:
    """How a model's prompt carries tools: `format` is what the model writes (and the ingress parses);
    any format but generic is the template's own rendering. `system_role`: the template renders a
    system message (where the generic format's prompt goes).
    """

    format: ToolCallFormat
    system_role: bool = True

    def chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The messages for `apply_chat_template` and its extra arguments (the tools, when it renders them)."""
        if self.format == "generic":
            return generic_chat(messages, tools, self.system_role), {}
        return messages, ({"tools": tools} if tools else {})


def resolve_tool_rendering(front: Any, configured: str, model: str) -> ToolRendering:
    """The model's `ToolRendering` from `capabilities.tool_call_format` and its template (`front`: a
    tokenizer or a processor). A named family whose template does not render tools is a `ConfigError`.
    """
    chosen = resolve_tool_format(configured, template_supports_tools(front), template_text(front), model)
    return ToolRendering(chosen, template_supports_system(front))


def template_text(front: Any) -> str:
    """The chat template's text (all of them, for a tokenizer with named templates)."""
    template = getattr(front, "chat_template", None) or ""
    return "\n".join(map(str, template.values())) if isinstance(template, dict) else str(template)


def marker_token_ids(tokenizer: Any, fmt: ToolCallFormat) -> frozenset[int]:
    """The special tokens that open the format's calls (`[TOOL_CALLS]`, `<|python_tag|>`): decoding
    keeps them in the text of a request with tools, so that the ingress sees where calls start.
    """
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    special = {str(token): int(i) for i, token in added.items() if getattr(token, "special", False)}
    return frozenset(special[m] for m in TOOL_MARKERS[fmt] if m in special)


def template_supports_system(front: Any) -> bool:
    """Whether the template renders a system message (some refuse the role, some drop it)."""
    try:
        text = front.apply_chat_template(
            [{"role": "system", "content": _SYSTEM_PROBE}, {"role": "user", "content": "hi"}],
            tokenize=False,
            add_generation_prompt=True,
        )
    except Exception:
        return False
    return _SYSTEM_PROBE in str(text)


def template_supports_tools(tokenizer: Any) -> bool:
    """Whether the chat template renders a tool list: a probe tool's name must appear in the prompt
    (SmolLM2's template never reads `tools`, so a tool list would vanish silently).
    """
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
    (e.g. a BOS where it adds one), token ids checked against the vocabulary.
    """
    ids = list(tokenizer(prompt).input_ids) if isinstance(prompt, str) else list(prompt)
    if not ids:
        raise InvalidRequestError("The prompt is empty.", param="prompt")
    return check_token_ids(ids, vocab_size, "prompt") if isinstance(prompt, list) else ids
