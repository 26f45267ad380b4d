"""`BatchSampler` against the sampler it replaced, row by row: the library's per-request warpers
(temperature, top-k, top-p) and one uniform number from the request's own generator through the
float64 cumulative distribution. Same seeds and parameters, same tokens, whatever else is in the
step; eager and static (captured) steps give the same tokens."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper
from transformers.generation.continuous_batching.cb_logits_processors import (
    ContinuousBatchingTemperatureLogitsWarper,
    ContinuousBatchingTopKLogitsWarper,
    ContinuousBatchingTopPLogitsWarper,
)

from deployments.engines.transformers.batch_sampler import BatchSampler
from deployments.engines.transformers.constraints import RequestConstraints
from deployments.engines.transformers.sampler_args import Arg, SamplingParams

VOCAB = 300
ROWS = 8


@dataclass
class FakeState:
    request_id: str


@dataclass
class FakeFuture:
    """What the manager passes `prepare_tensor_args` for each scheduled request."""

    state: FakeState
    has_new_token: bool = True


class FakeGrammar:
    """Allows a fixed set of tokens; records what it was given."""

    def __init__(self, allowed: set[int]) -> None:
        self.allowed, self.accepted = allowed, []

    def fill_mask(self, bitmask: np.ndarray, row: int) -> None:
        words = bitmask[row].view(np.uint32)
        words[:] = 0
        for token in self.allowed:
            words[token // 32] |= np.uint32(1 << (token % 32))

    def accept(self, token: int) -> None:
        self.accepted.append(token)


@dataclass
class Reference:
    """Today's sampler for one request: penalties over its own tokens, bias, grammar, then the
    library's warpers and the inverse-CDF draw from its own generator."""

    params: SamplingParams
    bias: dict[int, float] = field(default_factory=dict)
    allowed: set[int] | None = None
    counts: torch.Tensor = field(default_factory=lambda: torch.zeros(VOCAB))

    def __post_init__(self) -> None:
        seed = self.params.seed
        self.generator = None if seed is None or self.params.greedy else torch.Generator().manual_seed(seed % 2**63)

    def token(self, row: torch.Tensor) -> int:
        p = self.params
        scores = row.clone().unsqueeze(0)
        scores -= p.frequency * self.counts + p.presence * (self.counts > 0).float()
        for t, v in self.bias.items():
            scores[0, t] += v
        if self.allowed is not None:
            forbidden = torch.ones(VOCAB, dtype=torch.bool)
            forbidden[list(self.allowed)] = False
            scores[0] = scores[0].masked_fill(forbidden, float("-inf"))
        if p.greedy:
            chosen = int(scores.argmax())
        else:
            top_k = p.top_k or VOCAB
            warpers = [
                (ContinuousBatchingTemperatureLogitsWarper(TemperatureLogitsWarper(p.temperature)), p.temperature),
                (ContinuousBatchingTopKLogitsWarper(TopKLogitsWarper(top_k)), top_k),
                (ContinuousBatchingTopPLogitsWarper(TopPLogitsWarper(p.top_p)), p.top_p),
            ]
            for warper, value in warpers:
                arg = torch.tensor([value], dtype=torch.float32 if isinstance(value, float) else torch.int32)
                scores = warper(scores, arg.view(torch.int32))
            probs = scores[0].softmax(-1)
            assert self.generator is not None
            cumulative = probs.to(torch.float64).cumsum(0)
            u = torch.rand((), generator=self.generator, dtype=torch.float64) * cumulative[-1]
            chosen = int(torch.searchsorted(cumulative, u.reshape(1), right=True).clamp(max=VOCAB - 1))
        self.counts[chosen] += 1
        return chosen


def make_sampler(*, static: bool = False) -> BatchSampler:
    return BatchSampler(VOCAB, ROWS, slots=2 * ROWS, device=torch.device("cpu"), static=static)


def storage() -> torch.Tensor:
    """The manager's argument rows: one int32 column per logits row, and more columns than rows."""
    return torch.zeros(len(Arg), ROWS + 4, dtype=torch.int32)


def step(sampler: BatchSampler, ids: list[str], logits: torch.Tensor, args: torch.Tensor) -> list[int]:
    """One manager step: prepare, sample (the manager takes the argmax), then the host's bookkeeping."""
    sampler.prepare_tensor_args([FakeFuture(FakeState(i)) for i in ids], args)
    out = sampler(None, logits.clone(), args)
    sampler.after_step()
    return out[: len(ids)].argmax(dim=-1).tolist()


def constraints(
    bias: dict[int, float] | None = None, grammar: FakeGrammar | None = None, logprobs: int | None = None
) -> RequestConstraints | None:
    if bias is None and grammar is None and logprobs is None:
        return None
    c = RequestConstraints(logprobs=logprobs, grammar=grammar)  # type: ignore[arg-type]
    if bias:
        c.bias_ids = torch.tensor(list(bias), dtype=torch.long)
        c.bias_values = torch.tensor(list(bias.values()), dtype=torch.float32)
    return c


PARAMS = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.8, seed=1),
    SamplingParams(temperature=1.3, top_k=20, seed=2),
    SamplingParams(temperature=0.7, top_p=0.9, seed=3),
    SamplingParams(temperature=1.0, top_k=50, top_p=0.5, seed=2**64 + 7),
    SamplingParams(temperature=0.9, frequency=0.8, presence=0.5, seed=4),
    SamplingParams(temperature=0.0, frequency=1.5),
    SamplingParams(temperature=2.0, top_p=0.2, seed=5),
]


@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
def test_same_tokens_as_the_row_by_row_sampler(static):
    """Eight requests with different knobs in one batch, 30 steps: every seeded and greedy row's
    tokens are today's, penalties counting its own tokens."""
    sampler, args = make_sampler(static=static), storage()
    refs = {}
    for i, params in enumerate(PARAMS):
        bias = {7: 5.0, 11: -100.0} if i == 3 else {}
        sampler.add(f"r{i}", params, constraints(bias=bias or None))
        refs[f"r{i}"] = Reference(params, bias)
    gen = torch.Generator().manual_seed(0)
    for _ in range(30):
        logits = torch.randn(ROWS + 2, VOCAB, generator=gen) * 3  # more rows than requests, as the manager's
        got = step(sampler, list(refs), logits, args)
        assert got == [ref.token(logits[j]) for j, ref in enumerate(refs.values())]


def test_a_seeded_row_does_not_depend_on_the_others():
    """The same seeded request alone and beside others that come and go: the same tokens."""
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=42)
    gen = torch.Generator().manual_seed(1)
    rows = [torch.randn(VOCAB, generator=gen) for _ in range(20)]

    alone, args = make_sampler(), storage()
    alone.add("me", params, None)
    lone = [step(alone, ["me"], row.unsqueeze(0), args)[0] for row in rows]

    crowded, args = make_sampler(), storage()
    crowded.add("me", params, None)
    together = []
    for n, row in enumerate(rows):
        others = [f"o{n}-{k}" for k in range(n % 4)]
        for k, other in enumerate(others):
            crowded.add(other, SamplingParams(temperature=1.0, seed=None if k % 2 else n), None)
        logits = torch.cat([torch.randn(len(others), VOCAB, generator=gen), row.unsqueeze(0)])
        together.append(step(crowded, [*others, "me"], logits, args)[-1])
        for other in others:
            crowded.remove(other)
    assert together == lone


def test_unseeded_draws_follow_the_distribution():
    """A row with no seed draws from the device's generator: frequencies match its probabilities."""
    torch.manual_seed(0)
    sampler, args = make_sampler(), storage()
    sampler.add("r", SamplingParams(temperature=1.0), None)
    logits = torch.full((1, VOCAB), float("-inf"))
    logits[0, :4] = torch.log(torch.tensor([0.1, 0.2, 0.3, 0.4]))
    counts = np.bincount([step(sampler, ["r"], logits, args)[0] for _ in range(4000)], minlength=4)
    assert counts[4:].sum() == 0
    assert np.allclose(counts[:4] / 4000, [0.1, 0.2, 0.3, 0.4], atol=0.03)


def test_min_p_drops_the_unlikely_tokens():
    sampler, args = make_sampler(), storage()
    sampler.add("r", SamplingParams(temperature=1.0, min_p=0.5, seed=3), None)
    logits = torch.full((1, VOCAB), -20.0)
    logits[0, :3] = torch.log(torch.tensor([0.5, 0.3, 0.2]))  # 0.2 < 0.5 x 0.5: dropped; 0.3 kept
    drawn = {step(sampler, ["r"], logits, args)[0] for _ in range(300)}
    assert drawn == {0, 1}


@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
def test_grammar_and_logprobs_after_the_step(static):
    """The grammar's mask holds in the step; it learns the token after it, and the logprobs record
    the raw distribution (before bias and mask) with the chosen token's value."""
    grammar = FakeGrammar({5, 9})
    sampler, args = make_sampler(static=static), storage()
    c = constraints(bias={9: 50.0}, grammar=grammar, logprobs=3)
    assert c is not None
    sampler.add("g", SamplingParams(temperature=0.0), c)
    sampler.add("plain", SamplingParams(temperature=0.0), None)
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(2))
    tokens = step(sampler, ["g", "plain"], logits, args)
    assert tokens == [9, int(logits[1].argmax())]
    assert grammar.accepted == [9]
    raw = torch.log_softmax(logits[0], -1)
    (record,) = c.records
    assert record.token == 9 and record.logprob == pytest.approx(float(raw[9]), abs=1e-5)
    top = raw.topk(3)
    assert [t for t, _ in record.top] == top.indices.tolist()
    assert [v for _, v in record.top] == pytest.approx(top.values.tolist(), abs=1e-5)


def test_a_static_step_ignores_stale_padding_columns():
    """A captured step computes every padded row: the columns past the real rows are reset to plain
    greedy rows on the zero slot, so they never touch a real sequence's counts."""
    sampler, args = make_sampler(static=True), storage()
    sampler.add("p", SamplingParams(temperature=0.0, frequency=2.0), None)  # slot 1
    sampler.add("q", SamplingParams(temperature=0.0, frequency=2.0), None)  # slot 2
    logits = torch.zeros(ROWS, VOCAB)
    logits[:2, 3], logits[:2, 4] = 1.0, 0.5
    logits[2:, 4] = 10.0  # what the padding rows would choose
    assert step(sampler, ["p", "q"], logits, args) == [3, 3]
    assert step(sampler, ["p"], logits, args) == [4]  # q's column, left from the step before, is padding now
    assert step(sampler, ["q"], logits, args) == [4]  # token 4 never counted for q


def test_slots_are_bounded_and_freed():
    sampler = BatchSampler(VOCAB, ROWS, slots=1, device=torch.device("cpu"), static=False)
    sampler.add("a", SamplingParams(presence=1.0), None)
    sampler.add("free", SamplingParams(temperature=0.5, seed=1), None)  # needs no slot
    with pytest.raises(RuntimeError, match="no sampler slot"):
        sampler.add("b", SamplingParams(frequency=1.0), None)
    sampler.remove("a")
    sampler.add("b", SamplingParams(frequency=1.0), None)


@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
def test_the_static_decoders_path_gives_the_reference_tokens(static):
    """The static decoder's use: `prepare_rows` padded to a bucket of more columns than requests,
    `choose` over that many logits rows (its tokens left in `tokens`): the row-by-row reference's
    tokens, the padding rows changing nothing."""
    sampler = make_sampler(static=static)
    args = torch.zeros(len(Arg), ROWS, dtype=torch.int32)
    refs = {}
    for i, params in enumerate(PARAMS[:5]):
        sampler.add(f"r{i}", params, constraints(bias={3: 4.0} if i == 2 else None))
        refs[f"r{i}"] = Reference(params, {3: 4.0} if i == 2 else {})
    gen = torch.Generator().manual_seed(1)
    for _ in range(20):
        logits = torch.randn(ROWS, VOCAB, generator=gen) * 3
        sampler.prepare_rows(list(refs), args, ROWS)  # five requests padded to a bucket of eight
        tokens = sampler.choose(logits, args)
        sampler.after_step()
        expected = [ref.token(logits[j]) for j, ref in enumerate(refs.values())]
        assert tokens[:5].tolist() == expected
        assert sampler.tokens[:5].tolist() == expected


@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
def test_repetition_penalty_over_the_prompt_and_the_output(static):
    """vLLM's (HF's) rule: a seen token's positive logit divided by the penalty, a negative one
    multiplied; seen = in the prompt or generated. The row beside it is not penalized."""
    sampler, args = make_sampler(static=static), storage()
    sampler.add("pen", SamplingParams(temperature=0.0, repetition=1.5), None, prompt=[5])
    sampler.add("plain", SamplingParams(temperature=0.0), None, prompt=[5])
    logits = torch.full((2, VOCAB), -5.0)
    logits[:, 5], logits[:, 6], logits[:, 7] = 3.0, 2.5, 1.9  # penalized: 5 -> 2.0, 6 -> 1.67 once generated
    logits[:, 8] = -0.1  # never seen: left as it is
    assert step(sampler, ["pen", "plain"], logits, args) == [6, 5]
    assert step(sampler, ["pen", "plain"], logits, args) == [5, 5]
    negative = torch.full((1, VOCAB), -9.0)
    negative[0, 5], negative[0, 8] = -0.5, -0.9  # seen 5: -0.5 * 1.5 = -0.75, above -0.9
    assert step(sampler, ["pen"], negative, args) == [5]
    negative[0, 5] = -0.7  # -1.05, below -0.9
    assert step(sampler, ["pen"], negative, args) == [8]


@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
def test_banned_tokens_never_come_and_held_ones_only_after_min_tokens(static):
    """`ignore_eos` bans the end of sequence; `min_tokens` holds it and the stop token ids back for
    that many tokens of the sequence's own (another row's steps do not count)."""
    sampler, args = make_sampler(static=static), storage()
    sampler.add("ignore", SamplingParams(temperature=0.0, banned=(9,)), None)
    sampler.add("min", SamplingParams(temperature=0.0, held=(9, 4), held_until=2), None)
    sampler.add("late", SamplingParams(temperature=0.0, held=(9, 4), held_until=2), None)
    logits = torch.zeros(3, VOCAB)
    logits[:, 9], logits[:, 4], logits[:, 3] = 5.0, 4.0, 1.0
    tokens = [step(sampler, ["ignore", "min"], logits[:2], args) for _ in range(3)]
    assert tokens == [[4, 3], [4, 3], [4, 9]]
    assert step(sampler, ["late", "ignore"], logits[:2], args) == [3, 4]  # "late" has one token of its own
