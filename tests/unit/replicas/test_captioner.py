"""The captioner replica without Ray (the deployment class constructed directly, on a thread where its
constructor waits for the model): its metrics on the shipped fake engine, and how it waits for a model
that cannot load, on the tiny VLM."""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
import threading
import time
from pathlib import Path

import pytest
import torch

from deployments.config import Lifecycle, ModelConfig
from deployments.errors import CaptionerUnavailable
from deployments.monitoring import load_board
from deployments.protocol.replica import CaptionRequest, ComponentStatus
from deployments.replicas.captioner import VisionCaptioner, failure_kind, weights_unreachable
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


class RecordingBoard:
    """The load board as a list: what a waiting replica published, and whether it cleared its entry."""

    def __init__(self) -> None:
        self.published: list[ComponentStatus] = []
        self.cleared = False

    def publish(self, status: ComponentStatus) -> None:
        self.published.append(status)

    def clear(self) -> None:
        self.cleared = True


@pytest.fixture
def board(monkeypatch) -> RecordingBoard:
    recording = RecordingBoard()
    monkeypatch.setattr(load_board, "this_replica", lambda: recording)
    return recording


class Starting:
    """A captioner replica constructed on a thread, as Serve's replica constructs it: the
    constructor returns only once the model has loaded."""

    def __init__(self, weights: Path, *, corrupt: bool = False, **lifecycle) -> None:
        if corrupt:  # a config.json that is not JSON: a real failure, not weights that cannot be reached
            (weights / "config.json").write_text("{not json")
        model = ModelConfig(name="cap", local_path=str(weights))
        self.replicas: list[VisionCaptioner] = []
        self.thread = threading.Thread(
            target=lambda: self.replicas.append(VisionCaptioner.func_or_class(model, Lifecycle(**lifecycle))),  # type: ignore[attr-defined]
            daemon=True,
        )
        self.thread.start()

    def returned(self, timeout_s: float) -> VisionCaptioner | None:
        self.thread.join(timeout_s)
        return self.replicas[0] if self.replicas else None


def give_weights(weights: Path, tiny_vlm_dir: Path) -> None:
    for item in tiny_vlm_dir.iterdir():
        shutil.copy(item, weights / item.name)


def test_a_replica_whose_weights_cannot_be_reached_waits_in_its_constructor_and_says_why(
    tmp_path, tiny_vlm_dir, board, caplog
):
    """Serve shows a replica RUNNING (and the deployment HEALTHY) once its constructor returns: while
    the weights cannot be reached it does not return, and retries in place, one WARNING line without
    traceback per attempt; its status is on the load board meanwhile. Once the weights appear it
    loads them, clears its entry and returns."""
    caplog.set_level(logging.INFO, logger="ray.serve")
    starting = Starting(tmp_path, load_retry_s=0.3)
    assert starting.returned(1.5) is None
    assert board.published and not board.cleared
    status = board.published[-1]
    assert not status.ready and status.model == "cap" and status.details["state"] == "failed", status
    assert status.details["attempts"] >= 2  # retried in place, not replaced
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", status.details["next_retry_at"]), status
    assert str(tmp_path) in status.reason and status.reason.count(str(tmp_path)) == 1, status.reason
    said = [r for r in caplog.records if "cannot load" in r.getMessage()]
    assert len(said) == status.details["attempts"] or len(said) == status.details["attempts"] + 1, said
    assert all(r.levelno == logging.WARNING and r.exc_info is None for r in said), said
    assert "attempt 1" in said[0].getMessage() and " at " in said[0].getMessage()
    assert not any(r.exc_info for r in caplog.records) and "Traceback" not in caplog.text

    give_weights(tmp_path, tiny_vlm_dir)
    replica = starting.returned(60)
    assert replica is not None and board.cleared
    try:
        assert replica.status().ready
    finally:
        replica.__del__()


def test_a_real_failure_logs_its_traceback_and_waits_too(tmp_path, tiny_vlm_dir, board, caplog):
    starting = Starting(tmp_path, corrupt=True, load_retry_s=0.5)
    assert starting.returned(1.0) is None
    said = [r for r in caplog.records if "cannot load" in r.getMessage()]
    assert said and all(r.levelno == logging.ERROR and r.exc_info is not None for r in said), said
    assert "JSON" in (board.published[-1].reason or ""), board.published[-1]
    give_weights(tmp_path, tiny_vlm_dir)  # good weights over the broken ones: loaded at the next attempt
    replica = starting.returned(60)
    assert replica is not None and board.cleared
    replica.__del__()


async def test_a_model_that_fails_to_load_again_fails_the_health_check(tmp_path, tiny_vlm_dir, board):
    """Loaded, unloaded when idle, and its weights gone at the reload: Serve must replace the replica."""
    weights = tmp_path / "weights"
    weights.mkdir()
    give_weights(weights, tiny_vlm_dir)
    replica = Starting(weights, idle_unload_s=0.5, load_retry_s=60).returned(60)
    assert replica is not None and board.published == [] and board.cleared
    try:
        await replica.check_health()
        assert await wait_for(lambda: replica.status().details["state"] == "unloaded", 10)
        shutil.rmtree(weights)
        result = await replica.caption(CaptionRequest(images=[png_bytes()], prompts=["describe"]))
        assert result.captions == [] and "not loaded" in result.unavailable
        with pytest.raises(CaptionerUnavailable, match="captioner 'cap' cannot load"):
            await replica.check_health()
    finally:
        replica.__del__()


async def wait_for(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        await asyncio.sleep(0.1)
    return condition()


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
