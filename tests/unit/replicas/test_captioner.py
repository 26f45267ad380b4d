"""The captioner deployment's metrics, on the shipped fake engine and without Ray: the deployment
class is constructed directly."""

import asyncio
import shutil
import time

import pytest
import torch

from deployments.config import Lifecycle, ModelConfig
from deployments.errors import CaptionerUnavailable
from deployments.protocol.replica import CaptionRequest
from deployments.replicas import captioner as captioner_module
from deployments.replicas.captioner import VisionCaptioner, failure_kind
from deployments.replicas.serve_health import ServeView, startup_hold_s
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


def failing(tmp_path, **lifecycle) -> VisionCaptioner:
    """A captioner whose weights are missing (an empty directory): its load fails, and each retry."""
    model = ModelConfig(name="cap", local_path=str(tmp_path))
    replica = VisionCaptioner.func_or_class(model, Lifecycle(**lifecycle))  # type: ignore[attr-defined]
    replica.metrics = FakeMetrics()
    return replica


@pytest.mark.parametrize(
    ("view", "hold"),
    [
        (None, None),  # Serve cannot tell: never risk a final DEPLOY_FAILED
        (ServeView("UPDATING", "Deploying..."), None),  # no replica of this version has run yet
        (ServeView("UNHEALTHY", "A replica's health check failed. This deployment will be UNHEALTHY"), 0.0),
        (ServeView("UPSCALING"), None),  # e.g. from zero: failing its first start would be final too
        (ServeView("HEALTHY"), None),
        (ServeView("UNHEALTHY", "A replica failed to start with exception. Retrying. Error:\n..."), 60.0),
        (ServeView("UNHEALTHY", "The deployment failed to start 3 times in a row. This may be..."), 60.0),
    ],
)
def test_startup_hold_follows_what_serve_shows(view, hold):
    assert startup_hold_s(view, 60.0) == hold


async def test_health_check_fails_with_the_loaders_words_while_the_model_cannot_load(tmp_path, monkeypatch):
    replica = failing(tmp_path, unhealthy_restart_s=0.2)
    try:
        monkeypatch.setattr(captioner_module, "own_deployment", lambda: ServeView("UPDATING"))
        await replica.check_health()  # the start of a first deploy: passes, else Serve would give up for good
        with pytest.raises(CaptionerUnavailable, match=f"captioner 'cap' cannot load: .*{tmp_path}"):
            await replica.check_health()  # every later check fails: Serve shows UNHEALTHY and replaces it
    finally:
        replica.__del__()


async def test_a_replacement_retries_for_unhealthy_restart_s_then_fails_its_start(tmp_path, monkeypatch):
    replica = failing(tmp_path, unhealthy_restart_s=0.6)
    try:
        monkeypatch.setattr(captioner_module, "own_deployment", lambda: ServeView("UNHEALTHY", "failed to start"))
        started = time.monotonic()
        with pytest.raises(CaptionerUnavailable, match="cannot load"):
            await replica.check_health()
        assert time.monotonic() - started >= 0.6
    finally:
        replica.__del__()


async def test_a_replacement_that_loads_while_it_waits_passes(tmp_path, monkeypatch, tiny_vlm_dir):
    replica = failing(tmp_path, load_retry_s=0.2, unhealthy_restart_s=30)
    try:
        monkeypatch.setattr(captioner_module, "own_deployment", lambda: ServeView("UNHEALTHY", "failed to start"))
        for item in tiny_vlm_dir.iterdir():
            shutil.copy(item, tmp_path / item.name)
        await asyncio.wait_for(replica.check_health(), 30)  # the background retry loads it: no exception
        assert replica.status().ready
        await replica.check_health()
    finally:
        replica.__del__()


async def test_no_captioner_configured_is_healthy():
    await captioner(None).check_health()
