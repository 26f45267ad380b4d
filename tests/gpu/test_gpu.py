"""On a real GPU: engines load onto the device Ray would assign, in a GPU dtype, and generate."""

import pytest
import torch
from PIL import Image

from deployments.config import ModelConfig
from deployments.engines import create_caption_engine, create_text_engine
from deployments.protocol import GenerateRequest, TextMessage

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


async def test_text_engine_on_gpu(smollm2):
    engine = create_text_engine(ModelConfig(name="s", local_path=str(smollm2.parent), weight_file=smollm2.name))
    assert engine.device == "cuda:0"
    assert engine.describe()["dtype"] in ("bfloat16", "float16")
    request = GenerateRequest(
        messages=[TextMessage(role="user", content="What is the capital of France?")], temperature=0, max_tokens=16
    )
    text = "".join([p.text async for p in engine.generate(request)])
    assert "Paris" in text


def test_caption_engine_on_gpu(tiny_vlm_dir):
    engine = create_caption_engine(ModelConfig(name="v", local_path=str(tiny_vlm_dir)))
    assert engine.device == "cuda:0"
    captions = engine.caption([Image.new("RGB", (32, 32), (1, 2, 3))] * 2, ["Describe.", "Describe."])
    assert len(captions) == 2 and captions[0] == captions[1]
