"""The captioner deployment's metrics, on the shipped fake engine and without Ray: the deployment
class is constructed directly."""

import asyncio
import logging
import re
import shutil
import time

import pytest
import torch

from deployments.config import Lifecycle, ModelConfig
from deployments.errors import CaptionerUnavailable
from deployments.protocol.replica import CaptionRequest
from deployments.replicas import captioner as captioner_module
from deployments.replicas.captioner import VisionCaptioner, failure_kind, weights_unreachable
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
    result = await replica.caption(CaptionRequest(images=images, prompts=["describe"] * 3))
    assert len(result.captions) == 3 and result.unavailable is None
    metrics = replica.metrics
    assert metrics.count("images_captioned") == 3
    assert len(metrics.observed["caption_latency_seconds"]) == 1  # one per request
    assert sum(metrics.observed["caption_batch_size"]) == 3  # every image in some batch
    replica._sample()
    assert metrics.gauges["engine_loaded"] == 1


async def test_failures_are_counted_by_kind():
    replica = captioner(None)  # no captioner configured: unavailable, an answer that says why
    result = await replica.caption(CaptionRequest(images=[png_bytes()], prompts=["describe"]))
    assert result.captions == [] and "no captioner configured" in result.unavailable
    assert replica.metrics.count("caption_failures", kind="unavailable") == 1
    assert failure_kind(torch.OutOfMemoryError("CUDA out of memory")) == "oom"
    assert failure_kind(RuntimeError("bad")) == "error"


def failing(tmp_path, *, corrupt: bool = False, **lifecycle) -> VisionCaptioner:
    """A captioner whose weights are missing (an empty directory: the expected offline case), or
    with `corrupt`, broken (a config.json that is not JSON: a real failure). Its load fails, and each retry."""
    if corrupt:
        (tmp_path / "config.json").write_text("{not json")
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


async def test_unreachable_weights_pass_the_health_check_and_are_said_once_per_attempt(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="ray.serve")
    replica = failing(tmp_path, load_retry_s=30, unhealthy_restart_s=0.2)
    try:
        monkeypatch.setattr(captioner_module, "own_deployment", lambda: ServeView("UNHEALTHY", "failed to start"))
        for _ in range(3):  # no traceback in Serve's log, no replacement: the replica retries by itself
            await replica.check_health()
        status = replica.status()
        assert not status.ready and status.model == "cap", status  # never called ready while it cannot caption
        assert status.details["state"] == "failed" and status.details["attempts"] == 1, status
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", status.details["next_retry_at"]), status
        assert str(tmp_path) in status.reason and status.reason.count(str(tmp_path)) == 1, status.reason
        # An answer, not an exception: raised, Serve's replica would log "Request failed" and a
        # traceback for every image request that degrades as documented.
        result = await replica.caption(CaptionRequest(images=[png_bytes()], prompts=["describe"]))
        assert result.captions == [] and "not loaded" in result.unavailable and str(tmp_path) in result.unavailable
    finally:
        replica.__del__()
    said = [r for r in caplog.records if "cannot load" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING and said[0].exc_info is None, said
    line = said[0].getMessage()
    assert "attempt 1" in line and str(tmp_path) in line and f"at {status.details['next_retry_at']}" in line, line
    assert not any(r.exc_info for r in caplog.records) and "Traceback" not in caplog.text


async def test_a_real_failure_logs_its_traceback_and_fails_the_health_check(tmp_path, monkeypatch, caplog):
    replica = failing(tmp_path, corrupt=True, unhealthy_restart_s=0.2)
    try:
        monkeypatch.setattr(captioner_module, "own_deployment", lambda: ServeView("UPDATING"))
        await replica.check_health()  # the start of a first deploy: passes, else Serve would give up for good
        with pytest.raises(CaptionerUnavailable, match=r"captioner 'cap' cannot load: .*not a valid JSON"):
            await replica.check_health()  # every later check fails: Serve shows UNHEALTHY and replaces it
    finally:
        replica.__del__()
    said = [r for r in caplog.records if "cannot load" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.ERROR and said[0].exc_info is not None, said


async def test_a_replacement_retries_for_unhealthy_restart_s_then_fails_its_start(tmp_path, monkeypatch):
    replica = failing(tmp_path, corrupt=True, unhealthy_restart_s=0.6)
    try:
        monkeypatch.setattr(captioner_module, "own_deployment", lambda: ServeView("UNHEALTHY", "failed to start"))
        started = time.monotonic()
        with pytest.raises(CaptionerUnavailable, match="cannot load"):
            await replica.check_health()
        assert time.monotonic() - started >= 0.6
    finally:
        replica.__del__()


async def test_a_replacement_that_loads_while_it_waits_passes(tmp_path, monkeypatch, tiny_vlm_dir):
    replica = failing(tmp_path, corrupt=True, load_retry_s=0.2, unhealthy_restart_s=30)
    try:
        monkeypatch.setattr(captioner_module, "own_deployment", lambda: ServeView("UNHEALTHY", "failed to start"))
        for item in tiny_vlm_dir.iterdir():
            shutil.copy(item, tmp_path / item.name)
        await asyncio.wait_for(replica.check_health(), 30)  # the background retry loads it: no exception
        assert replica.status().ready
        await replica.check_health()
    finally:
        replica.__del__()


def test_which_load_errors_are_the_expected_offline_case(tmp_path):
    empty, missing = tmp_path / "empty", tmp_path / "missing"
    empty.mkdir()
    error = ValueError("Unrecognized processing class")
    assert weights_unreachable(ModelConfig(name="cap", local_path=str(empty)))(error)
    assert weights_unreachable(ModelConfig(name="cap", local_path=str(missing)))(OSError("Repo id must be ..."))
    (empty / "config.json").write_text("{}")
    assert not weights_unreachable(ModelConfig(name="cap", local_path=str(empty)))(error)  # there, but broken
    hub = weights_unreachable(ModelConfig(name="cap", hf_id="org/never-cached-model"))
    assert hub(OSError("We couldn't connect to 'https://huggingface.co' to load the files"))
    assert not hub(RuntimeError("CUDA out of memory"))


async def test_no_captioner_configured_is_healthy():
    await captioner(None).check_health()
