"""On a real GPU: engines load onto the device Ray would assign, in a GPU dtype, and generate."""

import os
from pathlib import Path

import pytest
import torch
from PIL import Image

from deployments.config import ModelConfig
from deployments.engines import create_caption_engine, create_text_engine
from deployments.protocol.replica import GenerateRequest, TextMessage
from scripts.bench.tiny_models import SMOLLM2_DIR, SMOLLM2_FILE

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture
def smollm2_here(request: pytest.FixtureRequest) -> Path:
    """The offline default GGUF (98 MB). models/ does not travel to a lent GPU machine, which has no
    network either: where the file is absent and nothing may be fetched (HF_HUB_OFFLINE=1, as
    scripts/gpu_check.sh sets), skip instead of failing on the download."""
    if not (SMOLLM2_DIR / SMOLLM2_FILE).is_file() and os.environ.get("HF_HUB_OFFLINE") == "1":
        pytest.skip(f"no {SMOLLM2_FILE} here and HF_HUB_OFFLINE=1 (models/ does not travel)")
    return request.getfixturevalue("smollm2")


async def test_text_engine_on_gpu(smollm2_here):
    gguf = ModelConfig(
        name="s", engine="transformers", local_path=str(smollm2_here.parent), weight_file=smollm2_here.name
    )
    engine = create_text_engine(gguf)
    assert engine.device == "cuda:0"
    assert engine.describe()["dtype"] in ("bfloat16", "float16")
    request = GenerateRequest(
        messages=[TextMessage(role="user", content="What is the capital of France?")], temperature=0, max_tokens=16
    )
    text = "".join([p.text async for p in engine.generate(request)])
    engine.close()
    assert "Paris" in text


def _tiny(tiny_llm_dir, **params) -> ModelConfig:
    params = {"dtype": "float32", "max_num_seqs": 4, "batching": "continuous", **params}  # the manager's graphs
    return ModelConfig(name="t", engine="transformers", local_path=str(tiny_llm_dir), params=params)


async def _answers(engine, requests: list[GenerateRequest]) -> list[str]:
    import asyncio

    async def one(request: GenerateRequest) -> str:
        return "".join([p.text async for p in engine.generate(request)])

    return list(await asyncio.gather(*(one(r) for r in requests)))


def _chats(**knobs) -> list[GenerateRequest]:
    prompts = ["hello there", "What is the capital of France?", "Count to five.", "Tell me a story."]
    return [GenerateRequest(messages=[TextMessage(role="user", content=p)], max_tokens=24, **knobs) for p in prompts]


async def test_captured_steps_give_the_same_greedy_tokens(tiny_llm_dir):
    """The same batch of greedy requests with CUDA graphs on and off (float32): the same answers."""
    answers = {}
    for mode in ("off", "on"):
        engine = create_text_engine(_tiny(tiny_llm_dir, cuda_graphs=mode))
        try:
            assert engine.describe()["cuda_graphs"] is (mode == "on")
            answers[mode] = await _answers(engine, _chats(temperature=0))
        finally:
            engine.close()
    assert answers["on"] == answers["off"] and all(answers["on"])


async def test_a_seeded_request_is_reproducible_beside_others_in_captured_steps(tiny_llm_dir):
    engine = create_text_engine(_tiny(tiny_llm_dir, cuda_graphs="on"))
    try:
        (seeded,) = _chats(temperature=1.0, top_p=0.9, seed=7)[:1]
        alone = await _answers(engine, [seeded])
        beside = await _answers(engine, [seeded, *_chats(temperature=1.0)[1:]])
        assert beside[0] == alone[0]
    finally:
        engine.close()


def test_caption_engine_on_gpu(tiny_vlm_dir):
    engine = create_caption_engine(ModelConfig(name="v", local_path=str(tiny_vlm_dir)))
    assert engine.device == "cuda:0"
    captions = engine.caption([Image.new("RGB", (32, 32), (1, 2, 3))] * 2, ["Describe.", "Describe."])
    assert len(captions) == 2 and captions[0] == captions[1]


# A real small VLM for the native engine, when one is on the machine: MMSERVE_NATIVE_VLM (a local
# directory or hub id), else the first of these in the local hub cache. None is downloaded.
NATIVE_CANDIDATES = (
    "Qwen/Qwen2-VL-2B-Instruct",
    "llava-hf/llava-interleave-qwen-0.5b-hf",
    "HuggingFaceTB/SmolVLM-256M-Instruct",
)


def _local_vlm() -> ModelConfig | None:
    import os
    from pathlib import Path

    from huggingface_hub import snapshot_download

    given = os.environ.get("MMSERVE_NATIVE_VLM")
    if given and Path(given).is_dir():
        return ModelConfig(name="vlm", local_path=given, capabilities={"vision_mode": "native"})
    for hub_id in ([given] if given else []) + list(NATIVE_CANDIDATES):
        try:
            snapshot_download(hub_id, local_files_only=True)
        except Exception:  # not in the cache
            continue
        return ModelConfig(name="vlm", hf_id=hub_id, capabilities={"vision_mode": "native"})
    return None


def _native_request(image: Image.Image) -> GenerateRequest:
    import hashlib
    import io

    from deployments.protocol.replica import ImageBytes, MessageImage, MessageText

    buf = io.BytesIO()
    image.save(buf, format="PNG")
    parts = [MessageImage(index=0), MessageText(text="What colour is this image? Answer in one word.")]
    message = TextMessage(role="user", content=parts[1].text, parts=parts)
    return GenerateRequest(
        messages=[message],
        images=[ImageBytes(data=buf.getvalue(), sha256=hashlib.sha256(buf.getvalue()).hexdigest())],
        temperature=0,
        max_tokens=8,
    )


async def test_native_engine_on_gpu_with_the_tiny_vlm(tiny_vlm_dir):
    model = ModelConfig(
        name="v", local_path=str(tiny_vlm_dir), params={"max_num_seqs": 2}, capabilities={"vision_mode": "native"}
    )
    engine = create_text_engine(model)
    assert engine.device == "cuda:0"
    info = engine.describe()
    assert info["memory_profile"]["measured"] == "cuda_max_allocated" and info["memory_budget_mb"] > 0
    pieces = [p async for p in engine.generate(_native_request(Image.new("RGB", (32, 32), (200, 0, 0))))]
    assert pieces[-1].prompt_tokens > 16 and pieces[-1].finish_reason in ("stop", "length")


async def test_native_engine_on_gpu_with_a_real_vlm():
    model = _local_vlm()
    if model is None:
        pytest.skip(f"no real VLM on this machine (MMSERVE_NATIVE_VLM, or one of {NATIVE_CANDIDATES} cached)")
    engine = create_text_engine(
        model.model_copy(update={"params": model.params.model_copy(update={"max_model_len": 4096})})
    )
    pieces = [p async for p in engine.generate(_native_request(Image.new("RGB", (256, 256), (220, 20, 20))))]
    answer = "".join(p.text for p in pieces).lower()
    assert "red" in answer, answer
