"""Static slots keep their last prompt (`static/slots.py`, llama.cpp's slot reuse): which free slot a
prompt takes (the one holding its longest prefix under its adapter, else the least recently freed),
and, on the engine with LoRA adapters, that a prefix computed under one adapter is never reused under
another, nor under an adapter loaded again under the same name.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from deployments.config import EngineParams, LoraConfig, ModelConfig
from deployments.engines import create_text_engine
from deployments.engines.transformers.static.engine import StaticTextEngine
from deployments.engines.transformers.static.slots import SlotTable
from deployments.protocol.replica import GenerateRequest
from scripts.bench.lora_adapters import build_lora


def ids(first: int, n: int = 20) -> list[int]:
    return list(range(first, first + n))


def test_a_prompt_takes_the_slot_that_holds_its_longest_prefix():
    table = SlotTable(3)
    for first in (100, 200, 300):
        slot, reused = table.take(ids(first), None)
        assert reused == 0
        table.release(slot, ids(first))
    slot, reused = table.take([*ids(200, 15), 7, 8], None)
    assert table.held(slot)[:15] == ids(200, 15) and reused == 15


def test_with_no_prefix_the_least_recently_freed_slot_goes_first():
    table = SlotTable(2)
    a, _ = table.take(ids(100), None)
    table.release(a, ids(100))
    b, _ = table.take(ids(200), None)
    table.release(b, ids(200))
    assert b != a
    c, reused = table.take(ids(300), None)
    assert c == a and reused == 0  # the first prompt's slot: the second's survives
    table.release(c, ids(300))
    assert table.take(ids(200), None) == (b, 19)


def test_a_few_shared_opening_tokens_do_not_take_a_sessions_slot():
    """A prefix of at most a tenth of the prompt (a chat template's opening) does not choose the slot;
    the least recently freed one is taken, and what it shares is still reused."""
    table = SlotTable(2)
    a, _ = table.take([1, 2, *ids(100)], None)
    table.release(a, [1, 2, *ids(100)])
    b, _ = table.take([1, 2, *ids(200)], None)
    table.release(b, [1, 2, *ids(200)])
    assert table.take([1, 2, *ids(300, 40)], None) == (a, 2)


def test_another_adapters_prefix_is_no_match():
    table = SlotTable(2)
    slot, _ = table.take(ids(100), "a")
    table.release(slot, ids(100))
    other, reused = table.take(ids(100), "b")
    assert other != slot and reused == 0
    table.release(other, ids(100))
    assert table.take(ids(100), "a") == (slot, 19)
    table.release(slot, ids(100))
    assert table.take(ids(100), None) == (other, 0)  # the base model: the least recently freed, nothing reused


def test_nothing_is_reused_when_off_or_for_a_request_that_asks_so():
    table = SlotTable(1)
    slot, _ = table.take(ids(100), None)
    table.release(slot, ids(100))
    assert table.take(ids(100), None, reuse=False) == (slot, 0)
    table.release(slot, ids(100))
    off = SlotTable(1, reuse=False)
    off.release(off.take(ids(100), None)[0], ids(100))
    assert off.take(ids(100), None) == (0, 0) and off.held(0) == []


def test_a_forgotten_adapter_leaves_nothing_to_reuse():
    table = SlotTable(1)
    table.release(table.take(ids(100), "a")[0], ids(100))
    table.forget("a")
    assert table.take(ids(100), "a") == (0, 0)


# ---------------------------------------------------------------------- the engine, with LoRA


@pytest.fixture(scope="module")
def adapters(tiny_llm_dir, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lora")
    return {name: build_lora(tiny_llm_dir, root / name, seed=seed) for name, seed in (("a", 1), ("b", 2))}


def ask(adapter: str | None) -> GenerateRequest:
    return GenerateRequest(prompt=ids(500, 40), temperature=0, max_tokens=8, adapter=adapter)


async def answer(engine: StaticTextEngine, adapter: str | None) -> tuple[str, int | None]:
    pieces = [p async for p in engine.generate(ask(adapter))]
    return "".join(p.text for p in pieces), pieces[-1].cached_prompt_tokens


async def test_a_prefix_is_reused_under_its_own_adapter_only(tiny_llm_dir, adapters):
    lora = LoraConfig(adapters={k: str(v) for k, v in adapters.items()})
    params = EngineParams(batching="static", max_num_seqs=3, lora=lora)
    engine = create_text_engine(ModelConfig(name="tiny", local_path=str(tiny_llm_dir), params=params))
    assert isinstance(engine, StaticTextEngine)
    try:
        engine.load_adapter("a", str(adapters["a"]))
        a, reused = await answer(engine, "a")
        assert reused == 0
        assert await answer(engine, "a") == (a, 39)
        base, reused = await answer(engine, None)  # the same prompt, held under "a" only
        assert reused == 0 and base != a
        assert await answer(engine, None) == (base, 39)
        engine.unload_adapter("a")  # "a" again, another adapter's weights: nothing held under the old "a"
        engine.load_adapter("a", str(adapters["b"]))
        b, reused = await answer(engine, "a")
        assert reused == 0 and b not in (a, base)
    finally:
        engine.close()
