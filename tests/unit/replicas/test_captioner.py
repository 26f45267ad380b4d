"""The captioner deployment's metrics, on the shipped fake engine and without Ray: the deployment
class is constructed directly."""

import pytest
import torch

from deployments.config import Lifecycle, ModelConfig
from deployments.errors import CaptionerUnavailable
from deployments.protocol.replica import CaptionRequest
from deployments.replicas.captioner import VisionCaptioner, failure_kind
from tests.conftest import png_bytes
from tests.unit.fake_metrics import FakeMetrics


def captioner(model: ModelConfig | None) -> VisionCaptioner:
    replica = VisionCaptioner.func_or_class(model, Lifecycle())  # type: ignore[attr-defined]
    replica.metrics = FakeMetrics()
    return replica


async def test_captions_are_counted_with_their_latency_and_batch_sizes():
    replica = captioner(ModelConfig(name="cap", engine="fake"))
    images = [png_bytes(), png_bytes((0, 0, 255)), png_bytes((0, 255, 0))]
    captions = await replica.caption(CaptionRequest(images=images, prompts=["describe"] * 3))
    assert len(captions) == 3
    metrics = replica.metrics
    assert metrics.count("images_captioned") == 3
    assert len(metrics.observed["caption_latency_seconds"]) == 1  # one per request
    assert sum(metrics.observed["caption_batch_size"]) == 3  # every image in some batch
    replica._sample()
    assert metrics.gauges["engine_loaded"] == 1


async def test_failures_are_counted_by_kind():
    replica = captioner(None)  # no captioner configured: unavailable
    with pytest.raises(CaptionerUnavailable):
        await replica.caption(CaptionRequest(images=[png_bytes()], prompts=["describe"]))
    assert replica.metrics.count("caption_failures", kind="unavailable") == 1
    assert failure_kind(torch.OutOfMemoryError("CUDA out of memory")) == "oom"
    assert failure_kind(RuntimeError("bad")) == "error"
