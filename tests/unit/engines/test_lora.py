"""LoRA adapters on the transformers engines (PEFT), with random adapters made here: an adapter
changes the greedy answer; its greedy tokens equal those of the base with the adapter merged into
its weights; a base row and two adapter rows decoded in one step each equal their answer alone; an
adapter that cannot be loaded is a 400 naming it and changes nothing else; where the engine takes them.
On llama.cpp, a random GGUF LoRA for the offline default SmolLM2 GGUF (written with the `gguf`
package) loads at start and changes the answer, and the base answer stays the base's."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from deployments.config import EngineParams, LoraConfig, ModelConfig, parse_models
from deployments.engines import create_text_engine
from deployments.engines.transformers.static.engine import StaticTextEngine
from deployments.errors import ConfigError, InvalidRequestError
from deployments.protocol.replica import GenerateRequest, TextMessage
from scripts.bench.lora_adapters import build_gguf_lora, build_lora, build_merged

PROMPT = "Tell me about the sea"


def ask(adapter: str | None = None, text: str = PROMPT) -> GenerateRequest:
    return GenerateRequest(
        messages=[TextMessage(role="user", content=text)], temperature=0, max_tokens=10, adapter=adapter
    )


@pytest.fixture(scope="module")
def adapters(tiny_llm_dir, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lora")
    return {name: build_lora(tiny_llm_dir, root / name, seed=seed) for name, seed in (("a", 1), ("b", 2))}


def lora_model(tiny_llm_dir, adapters, **params) -> ModelConfig:
    lora = LoraConfig(adapters={k: str(v) for k, v in adapters.items()})
    return ModelConfig(
        name="tiny", local_path=str(tiny_llm_dir), params=EngineParams(max_num_seqs=4, lora=lora, **params)
    )


@pytest.fixture(scope="module")
def engine(tiny_llm_dir, adapters):
    built = create_text_engine(lora_model(tiny_llm_dir, adapters))  # batching auto: static, with LoRA
    assert isinstance(built, StaticTextEngine)
    for name, folder in adapters.items():
        built.load_adapter(name, str(folder))
    yield built
    built.close()


async def tokens(engine, request: GenerateRequest) -> str:
    return "".join([p.text async for p in engine.generate(request)])


async def test_an_adapter_changes_the_answer(engine):
    base, a, b = await tokens(engine, ask()), await tokens(engine, ask("a")), await tokens(engine, ask("b"))
    assert len({base, a, b}) == 3


async def test_greedy_tokens_equal_the_adapter_merged_into_the_weights(engine, tiny_llm_dir, adapters, tmp_path):
    merged_dir = build_merged(tiny_llm_dir, adapters["a"], tmp_path / "merged")
    merged = create_text_engine(
        ModelConfig(name="merged", local_path=str(merged_dir), params=EngineParams(batching="static", max_num_seqs=1))
    )
    try:
        assert await tokens(merged, ask()) == await tokens(engine, ask("a"))
    finally:
        merged.close()


async def test_a_base_row_and_two_adapter_rows_in_one_step_each_equal_alone(engine):
    alone = [await tokens(engine, ask(adapter)) for adapter in (None, "a", "b")]
    steps: list[list[str | None]] = []
    rows = engine.lora_rows

    def recorded(adapters):
        steps.append(list(adapters))
        return rows(adapters)

    engine.lora_rows = recorded
    try:
        together = await asyncio.gather(*(tokens(engine, ask(adapter)) for adapter in (None, "a", "b")))
    finally:
        del engine.lora_rows
    assert together == alone
    assert any({None, "a", "b"} <= set(step) for step in steps)  # decoded in one step


async def test_a_seeded_adapter_answer_is_the_same_alone_and_beside_others(engine):
    def seeded(adapter: str | None) -> GenerateRequest:
        return ask(adapter).model_copy(update={"temperature": 1.0, "seed": 7})

    alone = await tokens(engine, seeded("a"))
    beside = await asyncio.gather(tokens(engine, seeded("a")), tokens(engine, ask("b")), tokens(engine, ask()))
    assert beside[0] == alone and await tokens(engine, seeded("a")) == alone


async def test_an_adapter_that_cannot_load_is_a_400_naming_it_and_changes_nothing(engine, tmp_path, adapters):
    before = [await tokens(engine, ask(adapter)) for adapter in (None, "a")]
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "adapter_config.json").write_text((adapters["a"] / "adapter_config.json").read_text())
    (corrupt / "adapter_model.safetensors").write_bytes(b"not a safetensors file")
    other = tmp_path / "other"  # another base's shapes: a wider model
    other.mkdir()
    config = json.loads((adapters["a"] / "adapter_config.json").read_text())
    (other / "adapter_config.json").write_text(json.dumps(config))
    from safetensors.torch import load_file, save_file

    weights = {k: v.repeat(2, 2) for k, v in load_file(adapters["a"] / "adapter_model.safetensors").items()}
    save_file(weights, other / "adapter_model.safetensors")
    for name, folder in (("corrupt", corrupt), ("other", other)):
        with pytest.raises(InvalidRequestError, match=name):
            engine.load_adapter(name, str(folder))
    assert engine.adapters is not None and engine.adapters.loaded == {"a", "b"}
    with pytest.raises(InvalidRequestError, match="'corrupt' is not loaded"):
        await tokens(engine, ask("corrupt"))
    assert [await tokens(engine, ask(adapter)) for adapter in (None, "a")] == before


def test_unloaded_adapters_leave_the_base_as_it_was(tiny_llm_dir, adapters):
    """The sequential engine too: with an adapter and once it is dropped."""
    built = create_text_engine(lora_model(tiny_llm_dir, adapters, batching="sequential"))
    try:
        base = asyncio.run(tokens(built, ask()))
        built.load_adapter("a", str(adapters["a"]))
        assert asyncio.run(tokens(built, ask("a"))) != base
        assert asyncio.run(tokens(built, ask())) == base
        built.unload_adapter("a")
        assert asyncio.run(tokens(built, ask())) == base
    finally:
        built.close()


def test_a_first_adapter_that_cannot_load_leaves_the_base_as_it_was(tiny_llm_dir, adapters, tmp_path):
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "adapter_config.json").write_text((adapters["a"] / "adapter_config.json").read_text())
    (corrupt / "adapter_model.safetensors").write_bytes(b"not a safetensors file")
    built = create_text_engine(lora_model(tiny_llm_dir, adapters, batching="sequential"))
    try:
        base = asyncio.run(tokens(built, ask()))
        with pytest.raises(InvalidRequestError, match="corrupt"):
            built.load_adapter("corrupt", str(corrupt))  # the first load of the engine's life
        assert asyncio.run(tokens(built, ask())) == base
        built.load_adapter("a", str(adapters["a"]))
        assert asyncio.run(tokens(built, ask("a"))) != base and asyncio.run(tokens(built, ask())) == base
    finally:
        built.close()


def test_continuous_batching_refuses_adapters(tiny_llm_dir, adapters):
    with pytest.raises(ConfigError, match="batching: static"):
        create_text_engine(lora_model(tiny_llm_dir, adapters, batching="continuous"))


def smollm2_with_lora(smollm2: Path, adapters: dict[str, str]) -> ModelConfig:
    params = {"max_num_seqs": 2, "max_model_len": 512, "temperature": 0, "cpu_threads": 2, "max_tokens": 8}
    return ModelConfig(
        name="smollm2",
        engine="llama.cpp",
        local_path=str(smollm2.parent),
        weight_file=smollm2.name,
        params={**params, "lora": {"adapters": adapters}},
    )


async def test_a_gguf_lora_loads_on_llamacpp_and_changes_the_answer(smollm2, tmp_path):
    from deployments.engines.llamacpp import LlamaCppTextEngine

    lora = build_gguf_lora(smollm2, tmp_path / "x.gguf", seed=1)
    built = create_text_engine(smollm2_with_lora(smollm2, {"x": str(lora)}))
    assert isinstance(built, LlamaCppTextEngine)
    try:
        question = "What is the capital of France?"
        base = await tokens(built, ask(text=question))
        built.load_adapter("x", str(lora))  # loaded at start: nothing to do
        assert await tokens(built, ask("x", question)) != base
        assert await tokens(built, ask(text=question)) == base
        with pytest.raises(InvalidRequestError, match="'y'"):
            built.load_adapter("y", str(lora))
    finally:
        built.close()


@pytest.mark.parametrize(("rank", "widen", "why"), [(4, 2, "made for another base"), (128, 1, "rank 128 is over")])
def test_a_gguf_adapter_for_another_base_or_too_high_a_rank_fails_the_build(smollm2, tmp_path, rank, widen, why):
    lora = build_gguf_lora(smollm2, tmp_path / "x.gguf", seed=1, rank=rank, widen=widen)
    entry = smollm2_with_lora(smollm2, {"x": str(lora)}).model_dump(exclude_unset=True)
    with pytest.raises(ConfigError, match=why) as err:
        parse_models({"models": [entry]}, tmp_path / "models.yaml")
    assert "params.lora.adapters.x" in str(err.value) and str(lora) in str(err.value)
