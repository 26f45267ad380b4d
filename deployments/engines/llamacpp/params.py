"""Our `GenerateRequest` as the body of llama.cpp's completion request, and llama.cpp's streamed
chunks as our pieces.

The body names every sampler setting it relies on, because llama.cpp's defaults are not OpenAI's:
min_p 0.05, top_k 40 and top_p 0.95 would otherwise narrow every request's distribution. Sampling
is per request in llama.cpp's batch (each slot has its own sampler chain and its own RNG seeded by
the request), so a seed gives the same answer whatever else runs beside it.

- temperature 0 is greedy (llama.cpp keeps only the most likely token; it never divides by 0);
- top_k 0 and top_p 1 turn those samplers off; min_p, typical_p, XTC, DRY and the repeat penalty
  are off;
- frequency and presence penalties: llama.cpp's, over the last `repeat_last_n` tokens of the
  sequence, set here to the context length, so the whole sequence (0, no window, when both are 0);
- seed: llama.cpp seeds are 32-bit, and 0xFFFFFFFF means "random": a 64-bit seed is taken modulo
  0xFFFFFFFF;
- logit_bias: token id -> bias, ids checked against the vocabulary (400 outside it);
- logprobs k: llama.cpp's `n_probs` (at least 1, so the chosen token's logprob comes back); the
  logprobs are the model's raw distribution (before sampling, bias and grammar), as in the
  transformers engines;
- a grammar: llama.cpp's `json_schema`, which it compiles with LLGuidance. The schema is checked
  here first with the same library (llama.cpp logs an invalid schema and then generates without
  it), and gets the transformers engines' bound on JSON whitespace (`x-guidance`); vLLM's
  `structured_outputs` regex, choice and grammar: llama.cpp's `grammar` as a Lark grammar for
  LLGuidance (``%llguidance {}`` first), checked here the same way;
- vLLM's extensions: `ignore_eos` is llama.cpp's own; `repetition_penalty` is its `repeat_penalty`
  (the same rule: a positive logit divided, a negative one multiplied) over the window above, the
  prompt included (llama.cpp's slots feed the prompt to the penalties);
  `stop_token_ids` are read from each token's id (`n_probs` asked for at least 1, the logprobs sent on
  only when asked for) and end the stream (`StopIds`); `min_tokens` and `skip_special_tokens: false`
  are refused (`UNSUPPORTED`): llama.cpp has no per-request switch for either (its EOS cannot be held
  back for a number of tokens, and its text leaves special tokens out for the whole server).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from deployments.config import EngineParams
from deployments.engines.defaults import setting
from deployments.engines.extensions import refuse_unsupported
from deployments.engines.grammar import JSON_KINDS, grammar_schema, lark_grammar, whitespace
from deployments.engines.tokens import check_token_ids
from deployments.errors import InvalidRequestError
from deployments.protocol.openai.common import TokenLogprob, TopLogprob
from deployments.protocol.replica import GenerateRequest, GrammarSpec

SEED_MODULUS = 0xFFFFFFFF  # llama.cpp's seeds are uint32; this value itself means "random"
# vLLM's extensions refused here, and why (see above)
UNSUPPORTED = {
    "min_tokens": "llama.cpp cannot hold the end of generation back for a number of tokens (ignore_eos holds it "
    "for the whole answer)",
    "skip_special_tokens": "llama.cpp leaves special tokens out of the text for the whole server, not per request",
}


def sampling_fields(request: GenerateRequest, params: EngineParams, window: int) -> dict[str, Any]:
    """The request's sampling settings (the model's defaults where it left them unset); `window`:
    the penalties' window, in tokens (the context: a whole sequence).
    """
    frequency = float(setting(request, params, "frequency_penalty"))
    presence = float(setting(request, params, "presence_penalty"))
    repetition = float(request.repetition_penalty or 1.0)
    fields: dict[str, Any] = {
        "temperature": float(setting(request, params, "temperature")),
        "top_p": float(setting(request, params, "top_p")),
        "top_k": int(setting(request, params, "top_k")),
        "min_p": float(setting(request, params, "min_p")),
        "typical_p": 1.0,
        "repeat_penalty": repetition,
        "xtc_probability": 0.0,
        "dry_multiplier": 0.0,
        "frequency_penalty": frequency,
        "presence_penalty": presence,
        "repeat_last_n": window if frequency or presence or repetition != 1.0 else 0,  # 0: no window to keep
    }
    if request.seed is not None:
        fields["seed"] = request.seed % SEED_MODULUS
    return fields


def logit_bias_field(bias: dict[int, float] | None, vocab_size: int) -> dict[str, Any]:
    """The request's `logit_bias` in the body llama.cpp takes; a 400 for a token id outside the vocabulary."""
    if not bias:
        return {}
    bad = sorted(t for t in bias if not 0 <= t < vocab_size)
    if bad:
        raise InvalidRequestError(
            f"logit_bias has token ids outside the vocabulary (0 to {vocab_size - 1}): {bad[:5]}", param="logit_bias"
        )
    return {"logit_bias": {str(token): float(value) for token, value in bias.items()}}


def json_schema_field(spec: GrammarSpec | None) -> dict[str, Any]:
    """llama.cpp's `json_schema` for a grammar spec, checked with LLGuidance (a 400 when invalid)."""
    if spec is None:
        return {}
    import llguidance

    if spec.kind not in JSON_KINDS:
        lark = lark_grammar(spec)
        return {"grammar": lark if lark.startswith("%llguidance") else "%llguidance {}\n" + lark}

    schema = grammar_schema(spec)
    if isinstance(schema, dict):
        guidance = {"whitespace_pattern": whitespace(spec), **schema.get("x-guidance", {})}
        schema = {**schema, "x-guidance": guidance}
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
    except ValueError as exc:
        raise InvalidRequestError(f"Invalid JSON schema: {exc}", param=spec.param) from exc
    if error := llguidance.LLMatcher.validate_grammar(grammar, None):
        raise InvalidRequestError(f"Invalid JSON schema: {error}", param=spec.param)
    return {"json_schema": schema}


def completion_body(request: GenerateRequest, params: EngineParams, vocab_size: int, context: int) -> dict[str, Any]:
    """Everything of llama.cpp's completion request but the prompt and `n_predict` (`context`: the
    model's context length); raises `InvalidRequestError` for what cannot be honoured.
    """
    refuse_unsupported(request, UNSUPPORTED, "llama.cpp", UNSUPPORTED)
    check_token_ids(request.stop_token_ids, vocab_size, "stop_token_ids")
    body: dict[str, Any] = {
        "stream": True,
        "timings_per_token": True,  # each chunk's `predicted_n`: completion tokens so far
        # A prompt whose prefix a slot still holds is computed from that cache, in a smaller batch than a
        # fresh prefill, and llama.cpp's logits differ (slightly) with the batch size: a seeded request,
        # which asks for the same answer every time, is computed whole.
        "cache_prompt": params.enable_prefix_caching and request.seed is None,
        **sampling_fields(request, params, context),
        **logit_bias_field(request.logit_bias, vocab_size),
        **json_schema_field(request.grammar),
    }
    if request.logprobs is not None or request.stop_token_ids:  # stop_token_ids: each token's id comes with it
        body["n_probs"] = max(request.logprobs or 0, 1)
    if request.ignore_eos:
        body["ignore_eos"] = True
    return body


@dataclass(frozen=True)
class StopIds:
    """vLLM's `stop_token_ids` on llama.cpp's stream: a chunk's logprob entries name each token's
    `id`; `cut` gives the chunk's text up to the first stop token (with it, when `include`), how many
    of its tokens count, and whether one was found.
    """

    ids: frozenset[int]
    include: bool = False

    def cut(self, text: str, entries: list[dict[str, Any]]) -> tuple[str, int, bool]:
        at = next((i for i, e in enumerate(entries) if e.get("id") in self.ids), None)
        if at is None:
            return text, len(entries), False
        kept = entries[: at + 1] if self.include else entries[:at]
        return "".join(str(e.get("token", "")) for e in kept), at + 1, True


@dataclass(frozen=True)
class Piece:
    """One streamed chunk: its text, completion tokens so far (None: not said), the finish reason
    on the last one, its tokens' logprob entries (llama.cpp's OpenAI form), the prompt's tokens as
    llama.cpp counted them (None: not said), and the prompt tokens that came from the prefix cache
    (each chunk's `timings`, which `timings_per_token` adds).
    """

    text: str
    tokens: int | None
    finish: Literal["stop", "length"] | None
    logprobs: list[dict[str, Any]]
    prompt_tokens: int | None = None
    cached: int = 0


class LlamaCppError(RuntimeError):
    """llama.cpp answered a request with an error; `status` is its HTTP status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def error_of(chunk: dict[str, Any]) -> LlamaCppError | None:
    """The error a chunk carries: ``{"error": {...}}``, or the fields alone."""
    error = chunk.get("error", chunk if "choices" not in chunk else None)
    if not isinstance(error, dict):
        return None
    message = str(error.get("message", error))
    code = error.get("code", 500)
    return LlamaCppError(message, code if isinstance(code, int) else 500)


def read_chunk(chunk: dict[str, Any]) -> Piece:
    """A streamed chunk of llama.cpp's OpenAI completion stream; raises the error it carries."""
    if (error := error_of(chunk)) is not None:
        raise error
    choice = chunk["choices"][0]
    finish = choice.get("finish_reason")
    timings = chunk.get("timings") or {}
    tokens, cached = timings.get("predicted_n"), int(timings.get("cache_n") or 0)
    if finish is not None and (usage := chunk.get("usage")):
        tokens = usage.get("completion_tokens", tokens)
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or cached)
    content = (choice.get("logprobs") or {}).get("content") or []
    return Piece(
        choice.get("text") or "",
        tokens,
        None if finish is None else ("length" if finish == "length" else "stop"),
        content,
        cached=cached,
    )


def read_native_chunk(chunk: dict[str, Any]) -> Piece:
    """A streamed chunk of llama.cpp's own ``/completion`` stream (`LlamaServer.stream_native`):
    `content`, `tokens_predicted`, `tokens_evaluated` (the prompt, image tokens included), and on the
    last one `stop` with its `stop_type` (``limit``: the length; ``eos`` or ``word``: a stop); its
    `completion_probabilities` have the entries of the OpenAI form; `timings.cache_n`: prompt tokens
    reused from the prefix cache. Raises the error it carries.
    """
    if "error" in chunk:
        raise error_of(chunk) or LlamaCppError(str(chunk["error"]), 500)
    finish: Literal["stop", "length"] | None = None
    if chunk.get("stop"):
        finish = "length" if chunk.get("stop_type") == "limit" else "stop"
    prompt = chunk.get("tokens_evaluated")
    return Piece(
        chunk.get("content") or "",
        chunk.get("tokens_predicted"),
        finish,
        chunk.get("completion_probabilities") or [],
        prompt if isinstance(prompt, int) else None,
        int((chunk.get("timings") or {}).get("cache_n") or 0),
    )


def token_logprobs(entries: list[dict[str, Any]], k: int) -> tuple[TokenLogprob, ...]:
    """llama.cpp's logprob entries as ours, with the `k` most likely alternatives."""
    return tuple(
        TokenLogprob.model_construct(
            token=entry.get("token", ""),
            bytes=list(entry.get("bytes") or []),
            logprob=float(entry.get("logprob", 0.0)),
            top_logprobs=[
                TopLogprob.model_construct(
                    token=t.get("token", ""), bytes=list(t.get("bytes") or []), logprob=t["logprob"]
                )
                for t in (entry.get("top_logprobs") or [])[:k]
            ],
        )
        for entry in entries
    )
