"""Deterministic engines for tests and demos (``engine: fake`` in models.yaml), with the same
interface as the real ones, like Ray Serve LLM's mock engine. They load nothing and never import
torch, so a test (or a laptop) can run the whole service in seconds.

- `FakeTextEngine` answers with the prompt it was given, one word per token, so a test reads
  exactly what reached the decoder: a chat as ``role: content`` lines (an assistant's tool calls
  as `` [called NAME(ARGUMENTS) as ID]``, a tool's answer as ``tool (ID): content``), after a
  ``tools: NAME, NAME`` line when the request brings tools; a legacy completion's prompt as it is
  (token ids as numbers separated by spaces). `fake.token_delay_ms` waits before each token;
  `fake.fill_to_max_tokens` goes on with `` tick`` tokens up to the length limit (a long, slow
  generation for deadline and overload tests). Its live generations are on /health (`stats`:
  ``running``), so a test sees that a cancelled request stopped generating.
  Instead of the echo: a request with a `grammar` gets a fixed JSON document (`json_object`: ``{}``;
  `json_schema`: the schema's `example` or first `examples` entry, else a minimal instance, see
  `minimal_instance`; a schema that is not a JSON object is a 400); a request with `tools` gets
  `fake.tool_call`, when set, written in the model's `capabilities.tool_call_format` (`auto`: Hermes,
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; see `call_text`), until the chat holds
  a tool's result: then the echo, so that an agent's tool loop (call, result, answer) ends.
  vLLM's extensions: `ignore_eos` goes on with `` tick`` tokens up to the length limit, `min_tokens`
  up to that many tokens; `structured_outputs`' `choice` answers its first choice (its `regex` and
  `grammar` are 400s here); the sampling ones are ignored, as the fake ignores temperature.
  With `logprobs` k, each word is a token whose logprob is ``-0.5 * (i % 3)`` (i from 0) and whose
  top alternatives are itself then ``" alt1"``, ``" alt2"``, ... each 1 lower: k entries, sorted.
  A prompt's tokens are its echo's words (split at spaces); `tokenize` gives each word an id from a
  vocabulary the engine grows as it meets words (so ids are per replica), and `detokenize` joins
  the words of known ids with spaces (an unknown id is a 400). Only when `params.max_model_len` is set
  is the context checked, as the transformers engines do (`context.fit_context`, with those words as
  tokens): a 400, or with `context_overflow: truncate` a chat's oldest turns dropped whole, so the
  echo shows exactly which messages (and captions) were kept.
- `FakeCaptionEngine` captions an image by its top-left pixel's colour and repeats the prompt it
  was asked with, so a test sees which request a caption was made for.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any, Literal

from PIL import Image

from deployments.config import ModelConfig, ToolCallFormat
from deployments.engines.base import CaptionEngine, EngineOutput, TextEngine
from deployments.engines.context import fit_context
from deployments.engines.defaults import limits as request_limits
from deployments.engines.tokens import check_token_ids
from deployments.errors import InvalidRequestError
from deployments.protocol.openai.common import TokenLogprob, TopLogprob
from deployments.protocol.replica import GenerateRequest, GrammarSpec, TextMessage, TokenizedPrompt, TokenizeInput

TICK = " tick"


def _message_line(message: TextMessage) -> str:
    if message.role == "tool":
        return f"tool ({message.tool_call_id}): {message.content}"
    line = f"{message.role}: {message.content}"
    for call in message.tool_calls or []:
        line += f" [called {call.function.name}({call.function.arguments}) as {call.id}]"
    return line


def echoed_prompt(request: GenerateRequest) -> str:
    """What the fake echoes: the prompt as it reached the decoder."""
    if request.prompt is not None:
        return request.prompt if isinstance(request.prompt, str) else " ".join(map(str, request.prompt))
    return _chat_text(request.messages, request.tools)


def _chat_text(messages: list[TextMessage], tools: list[dict[str, Any]] | None) -> str:
    lines = [_message_line(m) for m in messages]
    if tools:
        functions = [tool.get("function") for tool in tools]
        names = [str(f.get("name", "?")) if isinstance(f, dict) else "?" for f in functions]
        lines.insert(0, "tools: " + ", ".join(names))
    return "\n".join(lines)


def _words(text: str) -> int:
    """The fake's token count: words split at spaces."""
    return len(text.split(" "))


def minimal_instance(schema: Any, depth: int = 0) -> Any:
    """A small document for a simple JSON schema: its `const`, first `enum` value, `example` or first
    `examples` entry where it has one; else by type: an object of its required properties, an array
    of `minItems` items (at most 8), "", 0 (or `minimum`), false or null; `anyOf`/`oneOf`: the first
    choice. It ignores patterns, lengths and references, so it fits simple schemas only; a schema it
    cannot read gives ``{}``.
    """
    if not isinstance(schema, dict) or depth > 16:
        return {}
    for key in ("const", "example"):
        if key in schema:
            return schema[key]
    for key in ("enum", "examples", "anyOf", "oneOf"):
        choices = schema.get(key)
        if isinstance(choices, list) and choices:
            return choices[0] if key in ("enum", "examples") else minimal_instance(choices[0], depth + 1)
    kind = schema.get("type", "object" if "properties" in schema else None)
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        properties = schema.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        required = schema.get("required")
        names = [n for n in required if isinstance(n, str)] if isinstance(required, list) else []
        return {name: minimal_instance(properties.get(name, {}), depth + 1) for name in names}
    if kind == "array":
        items = schema.get("minItems", 0)
        count = min(items, 8) if isinstance(items, int) else 0
        return [minimal_instance(schema.get("items", {}), depth + 1) for _ in range(count)]
    if kind in ("integer", "number"):
        return schema.get("minimum", 0)
    return {"string": "", "boolean": False, "null": None}.get(str(kind), {})


def _grammar_document(grammar: GrammarSpec) -> str:
    if grammar.kind == "json_object":
        return "{}"
    if grammar.kind == "choice":
        return (grammar.choices or [""])[0]
    if grammar.kind != "json_schema":
        raise InvalidRequestError(f"The fake engine does not generate from a {grammar.kind}.", param=grammar.param)
    try:
        schema = json.loads(grammar.json_schema or "")
    except json.JSONDecodeError as exc:
        raise InvalidRequestError(f"Invalid JSON schema: {exc}", param="response_format") from exc
    if not isinstance(schema, dict | bool):
        raise InvalidRequestError("Invalid JSON schema: schema must be an object or boolean", param="response_format")
    return json.dumps(minimal_instance(schema))


def call_text(fmt: ToolCallFormat, name: str, arguments: dict[str, Any]) -> str:
    """One call as a model of that format writes it."""
    if fmt == "llama3_json":
        return "<|python_tag|>" + json.dumps({"name": name, "parameters": arguments})
    if fmt == "mistral":
        return "[TOOL_CALLS] " + json.dumps([{"name": name, "arguments": arguments}])
    if fmt == "pythonic":
        return f"[{name}({', '.join(f'{key}={value!r}' for key, value in arguments.items())})]"
    if fmt == "generic":
        return json.dumps([{"name": name, "arguments": arguments}])
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def _logprob(piece: str, i: int, k: int) -> TokenLogprob:
    value = -0.5 * (i % 3)
    top = [TopLogprob(token=piece, bytes=list(piece.encode()), logprob=value)][:k]
    top += [TopLogprob(token=f" alt{j}", bytes=list(f" alt{j}".encode()), logprob=value - j) for j in range(1, k)]
    return TokenLogprob(token=piece, bytes=list(piece.encode()), logprob=value, top_logprobs=top)


class FakeTextEngine(TextEngine):
    """A decoder that answers with the prompt it was given, one word per token (see the module's docstring)."""

    def __init__(self, model: ModelConfig) -> None:
        self.params = model.params
        self.settings = model.fake
        self.running = 0
        self.batch_invariant = self.params.batch_invariant  # its answers never depend on the batch: as set
        self._vocabulary: dict[str, int] = {}  # word -> its id, in the order first met
        configured = model.capabilities.tool_call_format
        self.tool_format = "hermes" if configured == "auto" else configured

    def describe(self) -> dict[str, Any]:
        return {"engine": "fake", **self.settings.model_dump()}

    def prefix_memory(self) -> tuple[int, int, int | None] | None:
        """As if each of its `max_num_seqs` slots kept its last prompt (so routing by prefix shows)."""
        return self.params.max_num_seqs, 0, None

    def stats(self) -> dict[str, Any]:
        return {"running": self.running, "waiting": 0}

    def tokenize(self, request: TokenizeInput) -> TokenizedPrompt:
        """The echo's words, each with its id in the engine's vocabulary (a new word gets the next id)."""
        prompt = GenerateRequest(messages=request.messages, prompt=request.prompt, tools=request.tools)
        words = echoed_prompt(prompt).split(" ")
        tokens = [self._vocabulary.setdefault(word, len(self._vocabulary)) for word in words]
        strs = words if request.return_token_strs else None
        limit = self.params.max_model_len or 0
        return TokenizedPrompt(tokens=tokens, count=len(tokens), max_model_len=limit, token_strs=strs)

    def detokenize(self, tokens: list[int]) -> str:
        words = list(self._vocabulary)
        return " ".join(words[t] for t in check_token_ids(tokens, len(words), "tokens"))

    def _answer(self, request: GenerateRequest) -> tuple[str, bool]:
        """The text to answer with, and whether it is the echo (which `fill_to_max_tokens` extends)."""
        if request.grammar is not None:
            return _grammar_document(request.grammar), False
        call = self.settings.tool_call
        if request.tools and call is not None and not any(m.role == "tool" for m in request.messages):
            return call_text(self.tool_format, call.name, call.arguments), False
        return echoed_prompt(request), True

    def _fit(self, request: GenerateRequest) -> tuple[GenerateRequest, int, int]:
        """The request as it fits `max_model_len` (when set), its completion limit and the prompt
        tokens truncation dropped.
        """
        if self.params.max_model_len is None:
            return request, request.max_tokens or self.params.max_tokens, 0
        limits = request_limits(self.params.max_model_len, request, self.params)
        if request.prompt is not None:
            return request, limits.completion(_words(echoed_prompt(request)), "prompt"), 0

        def count(messages: list[TextMessage]) -> int:
            return _words(_chat_text(messages, request.tools))

        fitted = fit_context(request.messages, count, limits, self.params.context_overflow)
        kept = request.model_copy(update={"messages": fitted.messages})
        return kept, fitted.max_tokens, fitted.dropped_prompt_tokens

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[EngineOutput, None]:
        request, limit, truncated = self._fit(request)
        prompt_words = _words(echoed_prompt(request))
        answer, echo = self._answer(request)
        words = [w if i == 0 else " " + w for i, w in enumerate(answer.split(" "))]
        fill = (self.settings.fill_to_max_tokens and echo) or request.ignore_eos
        ticks = limit - len(words) if fill else request.min_tokens - len(words)
        pieces = (words + [TICK] * max(ticks, 0))[:limit]
        delay_s = self.settings.token_delay_ms / 1000
        k = request.logprobs
        self.running += 1
        try:
            for i, piece in enumerate(pieces):
                await asyncio.sleep(delay_s)
                logprobs = () if k is None else (_logprob(piece, i, k),)
                yield EngineOutput(piece, i + 1, prompt_words, logprobs=logprobs, truncated_prompt_tokens=truncated)
            finish: Literal["stop", "length"] = "length" if fill or len(words) > limit else "stop"
            yield EngineOutput("", len(pieces), prompt_words, finish_reason=finish, truncated_prompt_tokens=truncated)
        finally:
            self.running -= 1


class FakeCaptionEngine(CaptionEngine):
    """A captioner whose caption names the image's corner colour and the prompt."""

    def __init__(self, model: ModelConfig) -> None:
        self.calls = 0

    def describe(self) -> dict[str, Any]:
        return {"engine": "fake"}

    def caption(self, images: list[Image.Image], prompts: list[str]) -> list[str]:
        self.calls += 1
        return [
            f"a picture whose corner is rgb{img.getpixel((0, 0))} for: {prompt}"
            for img, prompt in zip(images, prompts, strict=True)
        ]
