"""How a model's chat is written: the tool-call formats a model may use (`capabilities.tool_call_format`)
and the check of a `chat_template` override file (read by the builder, before any replica starts).

The formats (the strings that open a call in each, and the readers: `deployments.tools.formats`):

- ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Hermes, Qwen2.5, Qwen3);
- ``llama3_json``: ``{"name": ..., "parameters": {...}}``, after ``<|python_tag|>`` or at the start
  of the answer (Llama 3.1, 3.2, 3.3);
- ``mistral``: ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}]`` or ``[TOOL_CALLS]name[ARGS]{...}``;
- ``pythonic``: ``[get_weather(city="Paris"), ...]`` (Llama 3.2 and 4 pythonic templates, ToolACE);
- ``generic``: for a template that does not render tools: the tools are described in the system
  message, and a call is a JSON list ``[{"name": ..., "arguments": {...}}]`` as the whole answer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

ToolCallFormat = Literal["hermes", "llama3_json", "mistral", "pythonic", "generic"]
TOOL_CALL_FORMATS: tuple[ToolCallFormat, ...] = ("hermes", "llama3_json", "mistral", "pythonic", "generic")


def read_chat_template(path: Path) -> str:
    """The text of a chat template file; `ValueError` (the config error's message) when the file is
    missing, not text, or not a Jinja template as transformers compiles them.
    """
    if not path.is_file():
        raise ValueError(f"{path} is not a file")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} cannot be read as text: {exc}") from None
    if not text.strip():
        raise ValueError(f"{path} is empty")
    from jinja2 import TemplateSyntaxError, nodes
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):  # transformers' `{% generation %}` block, parsed as it parses it
        tags = {"generation"}

        def parse(self, parser: Any) -> nodes.Node:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body).set_lineno(lineno)

    environment = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols", Generation])
    try:
        environment.parse(text)
    except TemplateSyntaxError as exc:
        raise ValueError(f"{path} is not a valid Jinja template: line {exc.lineno}: {exc.message}") from None
    return text
