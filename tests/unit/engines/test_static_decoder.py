"""The static-slot decoder (`batching: static`) on a tiny random Llama in float32, on the CPU, where
it runs the same step functions as a GPU replica captures (eagerly: no compile, no capture)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from deployments.engines.transformers.batch_sampler import BatchSampler
from deployments.engines.transformers.sampler_args import SamplingParams
from deployments.engines.transformers.static.buckets import (
    batch_buckets,
    bucket,
    chunk_buckets,
    powers_up_to,
    window_buckets,
)
from deployments.engines.transformers.static.decoder import Chunk, DecodeRow, StaticDecoder

SLOTS = 8
MAX_LEN = 256
CHUNK = 32

PROMPTS = [
    [1, 500, 600, 700, 800, 900],
    [1, 42, 4242, 17, 9000, 31, 77, 1200, 5, 6, 7],
    [1, 3000, 3001],
    [1, *range(100, 150)],  # longer than a chunk: prefilled in two
]


@pytest.fixture(scope="module")
def reference(tiny_llm_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_llm_dir, dtype=torch.float32).eval()


@pytest.fixture
def decoder(tiny_llm_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_llm_dir, dtype=torch.float32).eval()
    sampler = BatchSampler(model.config.vocab_size, SLOTS, slots=2 * SLOTS, device=torch.device("cpu"), static=False)
    built = StaticDecoder(model, sampler, slots=SLOTS, max_len=MAX_LEN, chunk_tokens=CHUNK)
    yield built
    built.close()


def generated(reference, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = reference.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False)
    return out[0, len(prompt) :].tolist()


class Driver:
    """Runs sequences through the decoder as the engine's loop does: whole prompts in chunks, then
    one decode step for every sequence that has a token."""

    def __init__(self, decoder: StaticDecoder) -> None:
        self.decoder = decoder
        self.tokens: dict[str, list[int]] = {}
        self.state: dict[str, tuple[int, int]] = {}  # request id: (slot, next position)

    def start(self, request_id: str, slot: int, prompt: list[int]) -> None:
        start = 0
        while start < len(prompt):
            ids = prompt[start : start + CHUNK]
            last = start + len(ids) == len(prompt)
            [token] = self.decoder.prefill([Chunk(request_id, slot, ids, start, last)])
            start += len(ids)
        assert token is not None
        self.tokens[request_id] = [token]
        self.state[request_id] = (slot, len(prompt))

    def stop(self, request_id: str) -> None:
        del self.state[request_id]

    def step(self) -> None:
        rows = [DecodeRow(r, slot, self.tokens[r][-1], pos) for r, (slot, pos) in self.state.items()]
        for row, token in zip(rows, self.decoder.decode(rows), strict=True):
            self.tokens[row.request_id].append(token)
            self.state[row.request_id] = (row.slot, row.position + 1)


# --------------------------------------------------------------------------- buckets


def test_buckets_double_up_to_the_limit():
    assert batch_buckets(1) == (1,)
    assert batch_buckets(8) == (1, 2, 4, 8)
    assert batch_buckets(12) == (1, 2, 4, 8, 12)
    assert batch_buckets(32) == (1, 2, 4, 8, 16, 32)
    assert window_buckets(512) == (128, 256, 512)
    assert window_buckets(100) == (100,)
    assert chunk_buckets(512) == (16, 32, 64, 128, 256, 512)
    assert powers_up_to(5, 2) == (2, 4, 5)


def test_a_size_takes_the_smallest_bucket_that_holds_it():
    buckets = (1, 2, 4, 8)
    assert [bucket(buckets, n) for n in (1, 2, 3, 4, 5, 8)] == [1, 2, 4, 4, 8, 8]
    with pytest.raises(ValueError, match="past the largest"):
        bucket(buckets, 9)


def test_a_step_runs_at_its_batch_and_window_bucket(decoder):
    """Five rows run padded to eight; the window is the bucket one past the furthest position (127
    reads 128 positions, 128 reads 256)."""
    driver = Driver(decoder)
    for i in range(5):
        driver.start(f"r{i}", i, PROMPTS[i % 3])
    driver.step()
    assert decoder.last_shape == (8, 128)
    driver.state = {"r0": (0, 127)}
    driver.step()
    assert decoder.last_shape == (1, 128)
    driver.state = {"r0": (0, 128), "r1": (1, 3)}
    driver.step()
    assert decoder.last_shape == (2, 256)


# --------------------------------------------------------------------------- the model's own numbers


def test_logits_equal_the_models(decoder, reference):
    """Prefill (one chunk, and two) and a decode step give the logits of the model's own forward."""
    for slot, prompt in ((2, PROMPTS[0]), (5, PROMPTS[3])):
        chunks = [prompt[:CHUNK], prompt[CHUNK:]] if len(prompt) > CHUNK else [prompt]
        start = 0
        for piece in chunks:
            logits = decoder.prefill_logits([Chunk("r", slot, piece, start, True)])
            start += len(piece)
        with torch.inference_mode():
            expected = reference(torch.tensor([prompt])).logits[0, -1]
        torch.testing.assert_close(logits[0], expected, atol=1e-4, rtol=1e-4)
        token = int(expected.argmax())
        step = decoder.decode_logits([DecodeRow("r", slot, token, len(prompt))])
        with torch.inference_mode():
            expected = reference(torch.tensor([[*prompt, token]])).logits[0, -1]
        torch.testing.assert_close(step[0], expected, atol=1e-4, rtol=1e-4)


def test_greedy_tokens_equal_generate_padded_with_holes_and_reused_slots(decoder, reference):
    """Three sequences in slots 0, 3 and 6 (holes between, a padding row to make four) decode
    together; one ends and a new one takes its slot while the others go on: every sequence's greedy
    tokens are `generate`'s."""
    driver = Driver(decoder)
    for request_id, slot, prompt in (("a", 0, PROMPTS[0]), ("b", 3, PROMPTS[1]), ("c", 6, PROMPTS[3])):
        driver.start(request_id, slot, prompt)
    for _ in range(5):
        driver.step()
    assert decoder.last_shape[0] == 4
    driver.stop("b")
    driver.start("d", 3, PROMPTS[2])  # slot 3 reused: its stale K/V must not leak in
    for _ in range(7):
        driver.step()
    assert driver.tokens["a"] == generated(reference, PROMPTS[0], 13)
    assert driver.tokens["b"] == generated(reference, PROMPTS[1], 6)
    assert driver.tokens["c"] == generated(reference, PROMPTS[3], 13)
    assert driver.tokens["d"] == generated(reference, PROMPTS[2], 8)


def test_seeded_rows_are_reproducible_beside_others(decoder):
    """A seeded sampled sequence draws the same tokens alone and beside a greedy one and an
    unseeded sampled one (each row's draw depends on its own logits and seed only)."""
    sampler = decoder.sampler

    def run(request_id: str, slot: int, company: list[tuple[str, int, SamplingParams]]) -> list[int]:
        driver = Driver(decoder)
        sampler.add(request_id, SamplingParams(temperature=1.1, top_p=0.95, seed=1234), None)
        for other, other_slot, params in company:
            sampler.add(other, params, None)
            driver.start(other, other_slot, PROMPTS[1])
        driver.start(request_id, slot, PROMPTS[0])
        for _ in range(10):
            driver.step()
        for name in [request_id, *(c[0] for c in company)]:
            sampler.remove(name)
        return driver.tokens[request_id]

    alone = run("s1", 0, [])
    company = [("g", 1, SamplingParams(temperature=0.0)), ("u", 2, SamplingParams(temperature=1.5))]
    beside = run("s2", 3, company)
    assert alone == beside
    assert len(set(alone)) > 1


def test_buffers_keep_their_addresses_across_steps(decoder):
    """What a captured step reads and writes never moves: the cache, the input buffers (host and
    device), the output buffer and the sampler's tokens."""

    def addresses() -> list[int]:
        tensors = [*decoder.cache.keys, *decoder.cache.values, decoder.host, decoder.inputs, decoder.out]
        return [t.data_ptr() for t in [*tensors, decoder.sampler.tokens]]

    before = addresses()
    driver = Driver(decoder)
    for i in range(6):
        driver.start(f"r{i}", i, PROMPTS[i % 4])
        driver.step()
    driver.state = {"r0": (0, 200)}  # a larger window bucket
    driver.step()
    assert addresses() == before
