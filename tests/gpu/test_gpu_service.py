"""On a real GPU: the service with the decoder and the captioner packed at half a card each (the
builder's default where Ray has GPUs): text, an image captioned (not degraded), a stream, sixteen
chats at once, and both replicas holding memory on the same card."""

from __future__ import annotations

import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import ray
import torch
from ray import serve

from tests.conftest import data_url, png_bytes
from tests.serve.conftest import BASE_URL, deploy, image_chat, replica_pids, start_local_cluster, write_models

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs nvidia-smi"),
]
MODEL = "tiny"


@pytest.fixture(scope="module")
def service(tmp_path_factory, tiny_llm_dir, tiny_vlm_dir):
    start_local_cluster()
    models = write_models(
        tmp_path_factory.mktemp("gpu-service"),
        [
            {
                "name": MODEL,
                "local_path": str(tiny_llm_dir),
                "params": {"max_tokens": 8, "max_num_seqs": 16, "temperature": 0},
                "capabilities": {"vision_mode": "proxy", "captioner": "tiny-vlm"},
            },
            {"name": "tiny-vlm", "local_path": str(tiny_vlm_dir), "captioning": {"max_new_tokens": 4}},
        ],
    )
    deploy(models)
    yield
    serve.shutdown()
    ray.shutdown()


def chat(text: str, **extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], **extra}


def test_text_image_stream_and_sixteen_at_once(service):
    with httpx.Client(base_url=BASE_URL, timeout=120) as http:
        assert http.post("/v1/chat/completions", json=chat("hello")).status_code == 200
        image = http.post("/v1/chat/completions", json=image_chat(MODEL, data_url(png_bytes())))
        assert image.status_code == 200 and "x-vision-degraded" not in image.headers, image.headers
        with http.stream("POST", "/v1/chat/completions", json=chat("hi", stream=True)) as stream:
            assert stream.status_code == 200
            assert "data: [DONE]" in "".join(stream.iter_text())
        with ThreadPoolExecutor(16) as pool:
            codes = list(
                pool.map(lambda i: http.post("/v1/chat/completions", json=chat(f"n{i}")).status_code, range(16))
            )
        assert codes == [200] * 16


def test_both_replicas_hold_memory_on_one_card(service):
    query = ["nvidia-smi", "--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits"]
    apps = {
        int(pid): uuid.strip()
        for pid, uuid, _ in (line.split(",") for line in subprocess.check_output(query, text=True).splitlines())
    }
    decoder, captioner = replica_pids("default", "PrimaryDecoder"), replica_pids("vision", "VisionCaptioner")
    assert decoder and captioner
    cards = {apps.get(pid) for pid in decoder + captioner}
    assert len(cards) == 1 and None not in cards, (apps, decoder, captioner)
