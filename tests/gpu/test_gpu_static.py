"""The static-slot decoder on a CUDA GPU, with capture on: the decode step of every bucket captured
in a CUDA graph at start (eager kernels, and torch.compile'd first), then the CPU tests' checks on
the replayed steps: greedy tokens equal `generate` with padding rows, slot holes and a reused slot;
the buffers keep their addresses; no step runs without its graph; seeded rows beside others."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from deployments.engines.transformers.batch_sampler import BatchSampler
from deployments.engines.transformers.sampler_args import SamplingParams
from deployments.engines.transformers.static.decoder import StaticDecoder
from tests.unit.engines.test_static_decoder import PROMPTS, Driver, generated

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

SLOTS = 8
MAX_LEN = 256


@pytest.fixture(scope="module")
def reference(tiny_llm_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_llm_dir, dtype=torch.float32).to("cuda").eval()


@pytest.fixture(params=[False, True], ids=["captured", "compiled+captured"], scope="module")
def decoder(request, tiny_llm_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_llm_dir, dtype=torch.float32).to("cuda").eval()
    sampler = BatchSampler(model.config.vocab_size, SLOTS, slots=2 * SLOTS, device=model.device, static=True)
    max_len = 128 if request.param else MAX_LEN  # compiled: one window bucket, four shapes to compile
    built = StaticDecoder(
        model, sampler, slots=SLOTS, max_len=max_len, chunk_tokens=32, capture=True, compiled=request.param
    )
    yield built
    built.close()


def test_every_bucket_is_captured_at_start(decoder):
    assert decoder.captures == len(decoder.batches) * len(decoder.windows) == len(decoder.graphs)
    assert decoder.capture_s > 0
    assert decoder.describe()["graphs"] == decoder.captures


def test_captured_greedy_tokens_equal_generate(decoder, reference):
    captures, eager = decoder.captures, decoder.eager_steps
    driver = Driver(decoder)
    for request_id, slot, prompt in (("a", 0, PROMPTS[0]), ("b", 3, PROMPTS[1]), ("c", 6, PROMPTS[3])):
        driver.start(request_id, slot, prompt)
    for _ in range(5):
        driver.step()
    driver.stop("b")
    driver.start("d", 3, PROMPTS[2])
    for _ in range(7):
        driver.step()
    assert driver.tokens["a"] == generated(reference, PROMPTS[0], 13)
    assert driver.tokens["b"] == generated(reference, PROMPTS[1], 6)
    assert driver.tokens["c"] == generated(reference, PROMPTS[3], 13)
    assert driver.tokens["d"] == generated(reference, PROMPTS[2], 8)
    assert (decoder.captures, decoder.eager_steps) == (captures, eager)  # replayed only


def test_captured_buffers_keep_their_addresses(decoder):
    tensors = [*decoder.cache.keys, *decoder.cache.values, decoder.host, decoder.inputs, decoder.out]
    before = [t.data_ptr() for t in [*tensors, decoder.sampler.tokens]]
    driver = Driver(decoder)
    for i in range(5):
        driver.start(f"r{i}", i, PROMPTS[i % 4])
        driver.step()
    assert [t.data_ptr() for t in [*tensors, decoder.sampler.tokens]] == before


def test_captured_seeded_rows_are_reproducible_beside_others(decoder):
    sampler = decoder.sampler

    def run(request_id: str, company: list[tuple[str, SamplingParams]]) -> list[int]:
        driver = Driver(decoder)
        sampler.add(request_id, SamplingParams(temperature=1.1, top_p=0.95, seed=99), None)
        for slot, (other, params) in enumerate(company, start=1):
            sampler.add(other, params, None)
            driver.start(other, slot, PROMPTS[1])
        driver.start(request_id, 0, PROMPTS[0])
        for _ in range(10):
            driver.step()
        for name in [request_id, *(c[0] for c in company)]:
            sampler.remove(name)
        return driver.tokens[request_id]

    alone = run("s1", [])
    beside = run("s2", [("g", SamplingParams(temperature=0.0)), ("u", SamplingParams(temperature=1.5))])
    assert alone == beside


async def test_auto_runs_the_static_engine_on_a_gpu_with_the_managers_greedy_answers(tiny_llm_dir):
    """`batching: auto` on a CUDA GPU is the static decoder, every bucket captured at start; through the
    engine ABC its greedy answers (float32) are the continuous manager's."""
    from deployments.config import ModelConfig
    from deployments.engines import create_text_engine
    from deployments.engines.transformers.static.engine import StaticTextEngine
    from tests.gpu.test_gpu import _answers, _chats

    answers = {}
    for batching in ("auto", "continuous"):
        params = {"dtype": "float32", "max_num_seqs": 4, "batching": batching, "max_model_len": 256}
        engine = create_text_engine(
            ModelConfig(name="t", engine="transformers", local_path=str(tiny_llm_dir), params=params)
        )
        try:
            if batching == "auto":
                assert isinstance(engine, StaticTextEngine)
                info = engine.describe()
                assert info["graphs"] == engine.decoder.captures > 0 and info["capture_s"] > 0
            answers[batching] = await _answers(engine, _chats(temperature=0))
            if batching == "auto":
                assert engine.decoder.eager_steps == 0
        finally:
            engine.close()
    assert answers["auto"] == answers["continuous"] and all(answers["auto"])
