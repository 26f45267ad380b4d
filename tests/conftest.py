"""Shared fixtures: tiny real models (built once per session) and test images."""

from __future__ import annotations

import base64
import io
import os
from pathlib import Path

import pytest
from PIL import Image

from scripts.bench.tiny_models import build_tiny_gguf_vlm, build_tiny_llm, build_tiny_vlm, smollm2_gguf

# Ray's workers (Serve replicas running a test engine such as tests.support.native_probe) and the
# services tests start in subprocesses import the test helpers from this checkout.
ROOT = Path(__file__).resolve().parents[1]
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)


def png_bytes(color: tuple[int, int, int] = (255, 0, 0), size: tuple[int, int] = (48, 32)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


@pytest.fixture(scope="session")
def smollm2() -> Path:
    return smollm2_gguf()


@pytest.fixture(scope="session")
def tiny_llm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_llm(tmp_path_factory.mktemp("tiny-llm"))


@pytest.fixture(scope="session")
def tiny_vlm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"))


@pytest.fixture(scope="session")
def tiny_gguf_vlm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The SmolLM2 GGUF with a tiny LLaVA-style projector beside it (`TINY_MMPROJ_FILE`)."""
    return build_tiny_gguf_vlm(tmp_path_factory.mktemp("tiny-gguf-vlm"))
