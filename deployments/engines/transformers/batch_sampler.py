"""The continuous batch's sampler: every request's sampling as tensor ops over the whole step.

The manager hands the sampler one logits row per request with a new token (`prepare_tensor_args`
names them, in order). Each step runs, for all rows at once and with no per-row Python:

1. vLLM's (and HF's) multiplicative repetition penalty over the prompt's tokens (`prompt_seen[slot]`)
   and the output's, then OpenAI's penalties, from per-sequence token counts kept on the device
   (`counts[slot]`);
2. the raw log-probabilities and their top 20 (vLLM's `raw_logprobs`: before bias, grammar and
   warping), kept for the rows that ask;
3. `logit_bias` (a dense row per sequence, `bias[slot]`; the tokens that `ignore_eos` and `min_tokens`
   suppress are -inf there, those of `min_tokens` until the sequence has that many tokens: its row
   is rewritten on the batch's thread before the step that lifts them) and the JSON grammar's allowed tokens
   (llguidance's bitmask, 32 tokens per int32, unpacked on the device: one tensor op);
4. temperature, top-k, top-p and min-p from one sort (greedy rows: the argmax);
5. the draw by the inverse of each row's cumulative distribution, in float64, from one uniform
   number per row: a seeded request's comes from its own `torch.Generator` (CPU, drawn when the step
   is prepared), the others' from the device's generator. A seeded row's token thus depends on its
   own logits and seed only, never on the other rows;
6. the counts learn the chosen tokens; the manager takes the argmax of a one-hot on them.

Per-row parameters travel in the manager's own argument rows (`ARGS`, int32 views of the values,
copied to the device with the step's inputs); the larger per-sequence state lives in static device
buffers indexed by a slot that a sequence with penalties or a bias holds for its life (the others
read the zero slot). So a step reads only tensors whose addresses never change, and the same
kernels run whatever the batch holds: the step can be captured in a CUDA graph or compiled
(`static=True`). Eager (`static=False`, the CPU default) skips what no row of the step needs (a
step of plain greedy rows is the manager's argmax alone), decided from what the host knows of its
requests, never from device values: no step waits on the device in the sampler.

What needs the chosen tokens on the host (a grammar advancing, logprob records) happens in
`after_step`, which the engine runs after each step's outputs reached the host and before they
are handed to the requests' streams.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import LogitsProcessorList
from transformers.generation.continuous_batching.cb_logits_processors import ContinuousBatchingLogitsProcessorList

from deployments.engines.transformers.constraints import LogprobRecord, RequestConstraints
from deployments.engines.transformers.sampler_args import Arg, Row, SamplingParams

TOP_LOGPROBS = 20  # the most an OpenAI request may ask for


@dataclass
class _Sequence:
    """What the sampler keeps for one request on the host."""

    params: SamplingParams
    constraints: RequestConstraints | None
    generator: torch.Generator | None
    slot: int
    fresh: bool = True  # its slot is not yet set up on the device
    prompt: tuple[int, ...] = ()  # the prompt's token ids (the repetition penalty's)
    generated: int = 0  # tokens chosen so far (steps it had a row in)
    holding: bool = False  # `params.held` still suppressed

    @property
    def flags(self) -> Row:
        flags = Row(0)
        if self.params.greedy:
            flags |= Row.GREEDY
        if self.generator is not None:
            flags |= Row.SEEDED
        if self.constraints is not None and self.constraints.grammar is not None:
            flags |= Row.GRAMMAR
        if self.constraints is not None and self.constraints.logprobs is not None:
            flags |= Row.LOGPROBS
        return flags


_DEFAULT = _Sequence(SamplingParams(temperature=0.0), None, None, 0, fresh=False)  # rows of no known request


@dataclass(frozen=True)
class _Step:
    """What the host knows of the step being computed: its rows' sequences and what they need."""

    rows: list[_Sequence]
    flags: Row  # the union of the rows' flags
    sampled: bool  # a row draws (not greedy)
    penalized: bool
    biased: bool

    @property
    def trivial(self) -> bool:
        """Plain greedy rows only: the manager's argmax is the whole sampler."""
        return not (self.sampled or self.penalized or self.biased or self.flags & (Row.GRAMMAR | Row.LOGPROBS))


class BatchSampler(ContinuousBatchingLogitsProcessorList):
    """The sampler the engine gives the manager (see the module docstring). `slots`: how many
    sequences with penalties or a bias it holds at once (more are refused at `add`).
    """

    def __init__(self, vocab_size: int, max_rows: int, slots: int, device: torch.device, *, static: bool) -> None:
        super().__init__(LogitsProcessorList(), per_request_processors=False)
        self.do_processing = True
        self.tensors_required = len(Arg)
        self.static = static
        self.vocab_size, self.max_rows = vocab_size, max_rows
        self._words = (vocab_size + 31) // 32
        self._counts = torch.zeros(slots + 1, vocab_size, dtype=torch.float32, device=device)
        self._bias = torch.zeros(slots + 1, vocab_size, dtype=torch.float32, device=device)
        self._prompt_seen = torch.zeros(slots + 1, vocab_size, dtype=torch.bool, device=device)
        self._mask = torch.full((max_rows, self._words), -1, dtype=torch.int32, device=device)
        self._bits = torch.arange(32, dtype=torch.int32, device=device)
        self._tokens = torch.zeros(max_rows, dtype=torch.long, device=device)
        self._top = min(TOP_LOGPROBS, vocab_size)
        self._top_values = torch.zeros(max_rows, self._top + 1, dtype=torch.float32, device=device)
        self._top_ids = torch.zeros(max_rows, self._top, dtype=torch.long, device=device)
        self._free_slots = list(range(slots, 0, -1))
        self._sequences: dict[str, _Sequence] = {}
        self._lock = threading.Lock()
        self._step = _Step([], Row(0), False, False, False)

    def describe(self) -> dict[str, Any]:
        buffers = (self._counts, self._bias, self._mask, self._prompt_seen)
        return {"static": self.static, "buffers_mb": round(sum(b.nbytes for b in buffers) / 2**20, 1)}

    # ------------------------------------------------------------------ the requests' side (event loop)

    def add(
        self,
        request_id: str,
        params: SamplingParams,
        constraints: RequestConstraints | None,
        prompt: Sequence[int] = (),
    ) -> None:
        """Before the sequence can be scheduled; `prompt`: its token ids (for the repetition penalty)."""
        generator = None
        if params.seed is not None and not params.greedy:
            generator = torch.Generator().manual_seed(params.seed % 2**63)
        with self._lock:
            slot = 0
            if params.needs_slot or (constraints is not None and constraints.bias_ids is not None):
                if not self._free_slots:
                    raise RuntimeError("no sampler slot is free for a request with penalties or a logit bias")
                slot = self._free_slots.pop()
            kept = tuple(prompt) if params.repetition != 1.0 else ()
            self._sequences[request_id] = _Sequence(params, constraints, generator, slot, prompt=kept)

    def remove(self, request_id: str) -> None:
        with self._lock:
            sequence = self._sequences.pop(request_id, None)
            if sequence is not None and sequence.slot:
                self._free_slots.append(sequence.slot)

    # ------------------------------------------------------------------ the batch's side (its thread)

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        self._write_args(int32_tensor, [_DEFAULT])

    def prepare_tensor_args(self, requests_in_batch: list[Any], arg_storage: torch.Tensor) -> torch.Tensor:
        ids = [r.state.request_id for r in requests_in_batch if r.has_new_token]
        padded = min(self.max_rows, arg_storage.size(1)) if self.static else len(ids)
        return self.prepare_rows(ids, arg_storage, padded)

    def prepare_rows(self, ids: Sequence[str], arg_storage: torch.Tensor, padded: int) -> torch.Tensor:
        """The step's rows (one per request id, in order): their parameters written to `arg_storage`
        (`len(Arg)` int32 rows, one column per logits row; `padded` columns, the padding rows plain
        greedy on the zero slot), their grammar masks to the device. Then `__call__` or
        `choose` samples the step, and `after_step` follows once its tokens are on the host.
        """
        with self._lock:
            rows = [self._sequences.get(i, _DEFAULT) for i in ids]
        flags = Row(0)
        for sequence in rows:
            flags |= sequence.flags
            if sequence.fresh:
                self._set_up(sequence)
            elif sequence.holding and sequence.generated >= sequence.params.held_until:
                self._write_bias(sequence)  # min_tokens reached: its held tokens may be chosen from now on
            if sequence is not _DEFAULT:
                sequence.generated += 1
        self._step = _Step(
            rows,
            flags,
            sampled=any(not s.params.greedy for s in rows),
            penalized=any(s.params.penalized for s in rows),
            biased=any(
                s.params.suppresses or (s.constraints is not None and s.constraints.bias_ids is not None) for s in rows
            ),
        )
        rows_written = rows + [_DEFAULT] * (padded - len(rows))  # padding rows: plain greedy, on the zero slot
        if rows_written:
            self._write_args(arg_storage, rows_written)
        if flags & Row.GRAMMAR:
            self._write_masks(rows)
        return arg_storage

    def _set_up(self, sequence: _Sequence) -> None:
        """Its slot's counts cleared and bias written (on the batch's thread, as the manager writes its
        own static inputs, so that the step's kernels see them).
        """
        sequence.fresh = False
        if not sequence.slot:
            return
        self._counts[sequence.slot].zero_()
        seen = self._prompt_seen[sequence.slot]
        seen.zero_()
        if sequence.prompt:
            seen[torch.tensor(sequence.prompt, dtype=torch.long, device=seen.device)] = True
        sequence.holding = bool(sequence.params.held) and sequence.generated < sequence.params.held_until
        self._write_bias(sequence)

    def _write_bias(self, sequence: _Sequence) -> None:
        """Its slot's bias row: `logit_bias`, then -inf on the tokens it suppresses now."""
        row = self._bias[sequence.slot]
        row.zero_()
        constraints = sequence.constraints
        if constraints is not None and constraints.bias_ids is not None and constraints.bias_values is not None:
            row.index_add_(0, constraints.bias_ids.to(row.device), constraints.bias_values.to(row.device))
        params = sequence.params
        sequence.holding = sequence.holding and sequence.generated < params.held_until
        suppressed = params.banned + (params.held if sequence.holding else ())
        if suppressed:
            row[torch.tensor(suppressed, dtype=torch.long, device=row.device)] = float("-inf")

    def _write_args(self, storage: torch.Tensor, rows: Sequence[_Sequence]) -> None:
        n = len(rows)
        floats = np.zeros((len(Arg), n), dtype=np.float32)
        ints = floats.view(np.int32)
        uniforms = np.zeros(n, dtype=np.float64)
        for j, s in enumerate(rows):
            p = s.params
            greedy = p.greedy
            floats[Arg.TEMPERATURE, j] = 1.0 if greedy else p.temperature
            ints[Arg.TOP_K, j] = 1 if greedy else min(p.top_k or self.vocab_size, self.vocab_size)
            floats[Arg.TOP_P, j] = 1.0 if greedy else p.top_p
            floats[Arg.MIN_P, j] = 0.0 if greedy else p.min_p
            floats[Arg.FREQUENCY, j] = p.frequency
            floats[Arg.PRESENCE, j] = p.presence
            floats[Arg.REPETITION, j] = p.repetition
            ints[Arg.FLAGS, j] = int(s.flags)
            ints[Arg.SLOT, j] = s.slot
            if s.generator is not None:  # one number per step, as the sequence's own stream of draws
                uniforms[j] = torch.rand((), generator=s.generator, dtype=torch.float64).item()
        words = uniforms.view(np.int32).reshape(n, 2)  # little-endian: low word first
        ints[Arg.U_LOW], ints[Arg.U_HIGH] = words[:, 0], words[:, 1]
        storage[: len(Arg), :n].copy_(torch.from_numpy(ints))

    def _write_masks(self, rows: Sequence[_Sequence]) -> None:
        masks = np.full((len(rows), self._words), -1, dtype=np.int32)
        for j, s in enumerate(rows):
            if s.constraints is not None and s.constraints.grammar is not None:
                s.constraints.grammar.fill_mask(masks, j)
        self._mask[: len(rows)].copy_(torch.from_numpy(masks))

    def __call__(self, input_ids: Any, scores: torch.Tensor, logits_processor_args: torch.Tensor) -> torch.Tensor:
        step = self._step
        if not self.static and step.trivial:
            return scores
        n = min(scores.size(0), self.max_rows) if self.static else len(step.rows)
        return self.sample(scores, logits_processor_args[:, :n], step)

    @property
    def tokens(self) -> torch.Tensor:
        """The last step's tokens, one per row (a device buffer whose address never changes)."""
        return self._tokens

    def choose(self, scores: torch.Tensor, args: torch.Tensor) -> torch.Tensor:
        """The prepared step's tokens for the first `args.size(1)` rows of `scores` (also left in
        `tokens`): tensor ops only, so that a captured step holds the sampler too.
        """
        step = self._step
        if not self.static and step.trivial:
            tokens = scores[: args.size(1)].argmax(dim=-1)
            self._tokens[: tokens.size(0)].copy_(tokens)
            return tokens
        return self._choose(scores, args, step)

    def sample(self, scores: torch.Tensor, args: torch.Tensor, step: _Step) -> torch.Tensor:
        """The step's tokens as a one-hot per row (the first `args.size(1)` rows of `scores`)."""
        tokens = self._choose(scores, args, step)
        chosen = torch.full_like(scores, float("-inf"))
        chosen[: tokens.size(0)].scatter_(1, tokens.unsqueeze(1), 0.0)
        return chosen

    def _choose(self, scores: torch.Tensor, args: torch.Tensor, step: _Step) -> torch.Tensor:
        static = self.static
        n = args.size(1)
        logits = scores[:n]
        flags, slot = args[Arg.FLAGS], args[Arg.SLOT].long()
        if static or step.penalized:
            counts = self._counts.index_select(0, slot)
            seen = (counts > 0) | self._prompt_seen.index_select(0, slot)
            repetition = _f32(args[Arg.REPETITION]).unsqueeze(1)
            logits = torch.where(seen, torch.where(logits > 0, logits / repetition, logits * repetition), logits)
            penalty = _f32(args[Arg.FREQUENCY]).unsqueeze(1) * counts
            logits = logits - penalty - _f32(args[Arg.PRESENCE]).unsqueeze(1) * (counts > 0).float()
        if static or step.flags & Row.LOGPROBS:
            raw = torch.log_softmax(logits.float(), dim=-1)
            top = raw.topk(self._top, dim=-1)
            self._top_ids[:n].copy_(top.indices)
            self._top_values[:n, : self._top].copy_(top.values)
        if static or step.biased:
            logits = logits + self._bias.index_select(0, slot)
        if static or step.flags & Row.GRAMMAR:
            allowed = (self._mask[:n].unsqueeze(-1) >> self._bits) & 1
            forbidden = (allowed.reshape(n, -1)[:, : self.vocab_size] == 0) & _has(flags, Row.GRAMMAR).unsqueeze(1)
            logits = logits.masked_fill(forbidden, float("-inf"))
        tokens = logits.argmax(dim=-1)
        if static or step.sampled:
            drawn = self._draw(logits, args, flags)
            tokens = torch.where(_has(flags, Row.GREEDY), tokens, drawn)
        self._tokens[:n].copy_(tokens)
        if static or step.penalized:
            self._counts.index_put_((slot, tokens), torch.ones_like(tokens, dtype=torch.float32), accumulate=True)
        if static or step.flags & Row.LOGPROBS:
            self._top_values[:n, self._top].copy_(raw.gather(1, tokens.unsqueeze(1)).squeeze(1))
        return tokens

    def _draw(self, logits: torch.Tensor, args: torch.Tensor, flags: torch.Tensor) -> torch.Tensor:
        """Temperature, top-k, top-p and min-p (in the library's order and arithmetic: top-k keeps every
        token at least the k-th largest, top-p drops the tokens whose ascending cumulative mass is at
        most 1 - top_p), then one uniform number through the cumulative distribution.
        """
        n, vocab = logits.shape
        logits = logits / _f32(args[Arg.TEMPERATURE]).unsqueeze(1)
        ascending, order = torch.sort(logits, dim=-1)
        k = args[Arg.TOP_K].long().clamp(1, vocab)
        kth = ascending.gather(1, (vocab - k).unsqueeze(1))
        ascending = ascending.masked_fill(ascending < kth, float("-inf"))
        cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative <= (1 - _f32(args[Arg.TOP_P])).unsqueeze(1)
        drop[:, -1] = False
        logits = logits.masked_fill(logits < kth, float("-inf"))
        logits = logits.masked_fill(drop.scatter(1, order, drop), float("-inf"))
        probs = logits.softmax(dim=-1)
        min_p = _f32(args[Arg.MIN_P]).unsqueeze(1) * probs.max(dim=-1, keepdim=True).values
        probs = torch.where(probs < min_p, 0.0, probs)
        cumulative64 = probs.double().cumsum(dim=-1)
        seeded = torch.stack((args[Arg.U_LOW], args[Arg.U_HIGH]), dim=1).contiguous().view(torch.float64).squeeze(1)
        device_u = torch.rand(n, dtype=torch.float64, device=logits.device)
        u = torch.where(_has(flags, Row.SEEDED), seeded, device_u) * cumulative64[:, -1]
        return torch.searchsorted(cumulative64, u.unsqueeze(1), right=True).squeeze(1).clamp(max=vocab - 1)

    def after_step(self) -> None:
        """The step's tokens, now on the host: grammars advance and logprobs are recorded (only for the
        rows that have them).
        """
        step = self._step
        if not step.flags & (Row.GRAMMAR | Row.LOGPROBS):
            return
        n = len(step.rows)
        tokens = self._tokens[:n].tolist()
        top_values = self._top_values[:n].tolist() if step.flags & Row.LOGPROBS else []
        top_ids = self._top_ids[:n].tolist() if step.flags & Row.LOGPROBS else []
        for j, s in enumerate(step.rows):
            constraints = s.constraints
            if constraints is None:
                continue
            if constraints.grammar is not None:
                constraints.grammar.accept(tokens[j])
            if constraints.logprobs is not None:
                k = constraints.logprobs
                top = tuple(zip(top_ids[j][:k], top_values[j][:k], strict=True))
                constraints.records.append(LogprobRecord(tokens[j], top_values[j][self._top], top))


def _f32(row: torch.Tensor) -> torch.Tensor:
    return row.contiguous().view(torch.float32)


def _has(flags: torch.Tensor, flag: Row) -> torch.Tensor:
    return (flags & int(flag)) != 0
