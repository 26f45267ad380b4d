"""Per-request constraints on the next token, shared by both transformers engines: `logit_bias`, a
JSON grammar (`GrammarSpec`) and `logprobs`.

`constrain(scores, rows)` takes a batch of logits rows, one `RequestConstraints` (or None) per row,
and, in place and in this order: records each asking row's log-probabilities from the model's RAW
distribution (log-softmax of the logits as the model gave them, before temperature, top-k/top-p,
bias and grammar: vLLM's default `raw_logprobs`), adds the rows' biases, and masks the tokens each
row's grammar forbids. Once the engine knows the token each row got, `ConstrainedStep.accept`
advances the grammars and stores one `LogprobRecord` per token on its request, from the batch
thread; the request's stream turns them into `TokenLogprob`s on the event loop (`TokenTexts`).

Grammar library: llguidance (`llguidance` on PyPI; used by vLLM's `guidance` backend, llama.cpp
and SGLang). Measured on this 2-core CPU with SmolLM2's 49,152-token vocabulary, walking a JSON
document through a name/age/tags schema: grammar compile about 1 ms, token mask 9-16 us median,
40-65 us p90 (the first mask of a fresh tokenizer up to 1.5 ms); `json_object` the same. Its wheel
is 3 MB, one abi3 build for every CPython, with no dependencies. The others: xgrammar masks faster
(3-4 us median, 4-6 ms compile) but requires `triton` on Linux x86-64 (a CUDA toolchain package),
`apache-tvm-ffi`, torch and transformers; outlines-core masks in about 1 us from an index built
up front per schema (28 ms here, seconds for large schemas), and its JSON is a regular expression,
so `json_object` (any nesting) has no exact form. llguidance computes masks lazily (an Earley
parser over a lexer) and reports invalid schemas with a clear message (`Invalid type: objekt`).
Its torch helper applies masks with `torch.compile`; masks are applied here with numpy and torch
ops instead, so nothing is compiled at run time.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from deployments.engines.grammar import JSON_KINDS, grammar_schema, lark_grammar, whitespace
from deployments.errors import InvalidRequestError
from deployments.protocol.openai.common import TokenLogprob, TopLogprob
from deployments.protocol.replica import GenerateRequest, GrammarSpec

logger = logging.getLogger("ray.serve")

BIAS_LIMIT = 100.0


@dataclass(frozen=True)
class LogprobRecord:
    """One generated token as the sampling thread saw it: its raw log-probability and the `k` most
    likely tokens at its position, most likely first.
    """

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


class Grammar:
    """A request's grammar matcher, advanced by the tokens it gets. Only the sampling thread
    touches it once the request is running.
    """

    def __init__(self, matcher: Any, eos_ids: Sequence[int]) -> None:
        self._matcher = matcher
        self._eos_ids = list(eos_ids)

    def fill_mask(self, bitmask: np.ndarray, row: int) -> None:
        """Writes the allowed next tokens into `bitmask[row]` (32 tokens per int32, little-endian
        bits). At the grammar's end only EOS is allowed; a matcher in error (it never should be)
        allows only EOS too, so that the sequence ends instead of producing an empty distribution.
        """
        target = bitmask[row]
        if not self._matcher.is_error():
            self._matcher.unsafe_compute_mask_ptr(target.ctypes.data, target.nbytes)
        if self._matcher.is_error() or not target.any():
            logger.warning("grammar matcher failed (%s): ending the sequence", self._matcher.get_error())
            words = target.view(np.uint32)
            words[:] = 0
            for eos in self._eos_ids:
                words[eos // 32] |= np.uint32(1 << (eos % 32))

    def accept(self, token: int) -> None:
        if not self._matcher.is_stopped():
            self._matcher.consume_token(token)

    @property
    def finished(self) -> bool:
        return bool(self._matcher.is_stopped())


class GrammarCompiler:
    """Turns a `GrammarSpec` into a `Grammar` for one engine's tokenizer. The tokenizer's llguidance
    form is built on first use (about 0.3 s for 49k tokens), off the event loop.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: Sequence[int]) -> None:
        self._tokenizer, self._vocab_size, self._eos_ids = tokenizer, vocab_size, list(eos_ids)
        self._ll_tokenizer: Any = None
        self._lock = threading.Lock()

    def _tokenizer_for_grammars(self) -> Any:
        with self._lock:
            if self._ll_tokenizer is None:
                import llguidance.hf

                try:
                    self._ll_tokenizer = llguidance.hf.from_tokenizer(
                        self._tokenizer, n_vocab=self._vocab_size, eos_token=self._eos_ids
                    )
                except ValueError as exc:  # a slow (Python) tokenizer
                    raise InvalidRequestError(
                        f"response_format with a JSON schema is not supported for this model: {exc}",
                        param="response_format",
                    ) from exc
            return self._ll_tokenizer

    def compile(self, spec: GrammarSpec) -> Grammar:
        import llguidance

        what, param = ("JSON schema", spec.param) if spec.kind in JSON_KINDS else (spec.kind, spec.param)
        tokenizer = self._tokenizer_for_grammars()
        if spec.kind in JSON_KINDS:
            try:
                grammar = llguidance.LLMatcher.grammar_from_json_schema(
                    grammar_schema(spec), defaults={"whitespace_pattern": whitespace(spec)}
                )
            except ValueError as exc:
                raise InvalidRequestError(f"Invalid JSON schema: {exc}", param=param) from exc
        else:
            grammar = llguidance.LLMatcher.grammar_from_lark(lark_grammar(spec))
        if error := llguidance.LLMatcher.validate_grammar(grammar, tokenizer):
            raise InvalidRequestError(f"Invalid {what}: {error}", param=param)
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise InvalidRequestError(f"Invalid {what}: {matcher.get_error()}", param=param)
        return Grammar(matcher, self._eos_ids)


@dataclass
class RequestConstraints:
    """What one sequence asks of the sampler. `records` grows from the sampling thread (one entry per
    generated token when `logprobs` is set) and is read by the request's stream.
    """

    logprobs: int | None = None
    bias_ids: torch.Tensor | None = None
    bias_values: torch.Tensor | None = None
    grammar: Grammar | None = None
    records: list[LogprobRecord] = field(default_factory=list)


def build_constraints(
    request: GenerateRequest, vocab_size: int, grammars: GrammarCompiler
) -> RequestConstraints | None:
    """The request's constraints (None when it has none: the sampler's fast path). Checks the bias's
    token ids and compiles the grammar; raises `InvalidRequestError` for what cannot be honoured.
    """
    constraints = RequestConstraints(logprobs=request.logprobs)
    if request.logit_bias:
        bad = sorted(t for t in request.logit_bias if not 0 <= t < vocab_size)
        if bad:
            raise InvalidRequestError(
                f"logit_bias has token ids outside the vocabulary (0 to {vocab_size - 1}): {bad[:5]}",
                param="logit_bias",
            )
        values = [float(v) for v in request.logit_bias.values()]
        if any(not -BIAS_LIMIT <= v <= BIAS_LIMIT for v in values):
            raise InvalidRequestError("logit_bias values must be between -100 and 100.", param="logit_bias")
        constraints.bias_ids = torch.tensor(list(request.logit_bias), dtype=torch.long)
        constraints.bias_values = torch.tensor(values, dtype=torch.float32)
    if request.grammar is not None:
        constraints.grammar = grammars.compile(request.grammar)
    if constraints.logprobs is None and constraints.bias_ids is None and constraints.grammar is None:
        return None
    return constraints


class ConstrainedStep:
    """One step's constrained rows, between `constrain` and the engine's choice of tokens."""

    def __init__(
        self, rows: list[tuple[int, RequestConstraints]], logprob_rows: list[int], logprobs: torch.Tensor | None
    ) -> None:
        self.rows, self._logprob_rows, self._logprobs = rows, logprob_rows, logprobs
        self._top: tuple[list[list[float]], list[list[int]]] | None = None
        if logprobs is not None:
            k = max(c.logprobs or 0 for _, c in rows)
            if k:
                values, ids = logprobs.topk(min(k, logprobs.size(-1)), dim=-1)  # sorted, most likely first
                self._top = (values.tolist(), ids.tolist())

    @property
    def indices(self) -> list[int]:
        return [i for i, _ in self.rows]

    def accept(self, chosen: torch.Tensor) -> None:
        """`chosen`: one token id per constrained row, in `rows` order."""
        tokens = chosen.reshape(-1).tolist()
        picked: list[float] = []
        if self._logprobs is not None:
            lp_tokens = torch.tensor([tokens[j] for j in self._logprob_rows], dtype=torch.long)
            picked = self._logprobs.gather(1, lp_tokens.unsqueeze(1)).squeeze(1).tolist()
        lp_slot = 0
        for j, (_, constraints) in enumerate(self.rows):
            token = tokens[j]
            if constraints.grammar is not None:
                constraints.grammar.accept(token)
            if constraints.logprobs is not None:
                k = constraints.logprobs
                top: tuple[tuple[int, float], ...] = ()
                if k and self._top is not None:
                    values, ids = self._top[0][lp_slot], self._top[1][lp_slot]
                    top = tuple(zip(ids[:k], values[:k], strict=True))
                constraints.records.append(LogprobRecord(token, picked[lp_slot], top))
                lp_slot += 1


def constrain(scores: torch.Tensor, rows: Sequence[RequestConstraints | None]) -> ConstrainedStep | None:
    """Applies `rows[i]` to `scores[i]` in place (logprobs recorded from the raw row first, then bias,
    then the grammar's mask); None when no row has constraints. `scores` may have more rows than
    `rows` (the manager's rows without a new token): those are left alone.
    """
    active = [(i, c) for i, c in enumerate(rows) if c is not None]
    if not active:
        return None
    logprob_rows = [j for j, (_, c) in enumerate(active) if c.logprobs is not None]
    logprobs = None
    if logprob_rows:
        index = torch.tensor([active[j][0] for j in logprob_rows], dtype=torch.long, device=scores.device)
        logprobs = torch.log_softmax(scores.index_select(0, index).float(), dim=-1).cpu()
    step = ConstrainedStep(active, logprob_rows, logprobs)
    for i, c in active:
        if c.bias_ids is not None and c.bias_values is not None:
            scores[i].index_add_(0, c.bias_ids.to(scores.device), c.bias_values.to(scores.device, scores.dtype))
    grammars = [(i, c.grammar) for i, c in active if c.grammar is not None]
    if grammars:
        vocab = scores.size(-1)
        bitmask = np.zeros((len(grammars), (vocab + 31) // 32), dtype=np.int32)
        for j, (_, grammar) in enumerate(grammars):
            grammar.fill_mask(bitmask, j)
        allowed = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")[:, :vocab]
        forbidden = torch.from_numpy(allowed == 0).to(scores.device)
        for j, (i, _) in enumerate(grammars):
            scores[i].masked_fill_(forbidden[j], float("-inf"))
    return step


# --------------------------------------------------------------------------- token texts


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte as the printable character a byte-level BPE vocabulary
    stores it as (the tokenizers library's `ByteLevel`).
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class TokenTexts:
    """A token's text (the single token decoded) and its raw bytes, cached per id.

    Bytes: a byte-level BPE vocabulary (GPT-2, Llama 3, Qwen, SmolLM2) stores each token as one
    character per byte, so a token that is part of a multi-byte character (whose text decodes to
    U+FFFD) still gets its exact bytes, through that alphabet's inverse; a SentencePiece byte-fallback
    token ``<0xNN>`` is its byte, and ``▁`` a space; added tokens (``<|im_end|>``) and anything else
    are the UTF-8 of their text.
    """

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        byte_level = backend is not None and "ByteLevel" in repr(backend.decoder)
        self._byte_decoder = {c: b for b, c in _bytes_to_unicode().items()} if byte_level else None
        self._added = {int(i): str(t) for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()}
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def entry(self, token: int) -> tuple[str, list[int]]:
        cached = self._cache.get(token)
        if cached is None:
            text = str(self._tokenizer.decode([token], skip_special_tokens=False))
            cached = self._cache[token] = (text, self._bytes(token, text))
        return cached

    def _bytes(self, token: int, text: str) -> list[int]:
        if token in self._added:
            return list(self._added[token].encode())
        piece = self._tokenizer.convert_ids_to_tokens(token)
        if isinstance(piece, str):
            if self._byte_decoder is not None and all(c in self._byte_decoder for c in piece):
                return [self._byte_decoder[c] for c in piece]
            if match := _BYTE_FALLBACK.fullmatch(piece):
                return [int(match.group(1), 16)]
            if self._byte_decoder is None:
                return list(piece.replace("▁", " ").encode())
        return list(text.encode())

    def logprob(self, record: LogprobRecord) -> TokenLogprob:
        text, raw = self.entry(record.token)
        top = []
        for token, value in record.top:
            top_text, top_raw = self.entry(token)
            top.append(TopLogprob.model_construct(token=top_text, bytes=top_raw, logprob=value))
        return TokenLogprob.model_construct(token=text, bytes=raw, logprob=record.logprob, top_logprobs=top)


class LogprobStream:
    """Hands each streamed piece the logprobs of the tokens its text carries: everything recorded up
    to the tokens decoded so far, so the pieces' logprobs concatenate to one entry per token.
    """

    def __init__(self, constraints: RequestConstraints | None, texts: TokenTexts) -> None:
        self._constraints = constraints if constraints is not None and constraints.logprobs is not None else None
        self._texts, self._sent = texts, 0

    def take(self, tokens: int) -> tuple[TokenLogprob, ...]:
        if self._constraints is None:
            return ()
        records = self._constraints.records[self._sent : tokens]
        self._sent += len(records)
        return tuple(self._texts.logprob(r) for r in records)
