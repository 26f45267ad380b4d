"""One captioner status on every surface, for the offline default's case (weights that cannot be
reached): the replica's own status (a real `VisionCaptioner` over an empty directory, waiting in its
constructor, as it publishes it on the load board), through the ingress's client and `/health`
(`HealthService`), on the ready line (`scripts/ready.py`) and in `scripts/status.sh`: the same state,
model, attempt, next attempt and cause, the cause once. And while no replica runs and none has said
why, /health's answer from Serve's view names the model too and says the cause once."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from deployments.config import Lifecycle, ModelConfig, ProxyVisionConfig
from deployments.ingress.health import HealthService
from deployments.ingress.serve_status import DeploymentView
from deployments.monitoring import load_board
from deployments.protocol.replica import ComponentStatus
from deployments.replicas.captioner import VisionCaptioner
from scripts.ready import vision_state
from tests.unit.ingress.fakes import FakeDecoder
from tests.unit.ingress.test_captioner_client import ClientWithFakeServe

ROOT = Path(__file__).resolve().parents[2]
WAITING = DeploymentView("UPDATING", "Serve reports VisionCaptioner UPDATING", {"STARTING": 1})


class StopWaiting(Exception):
    """Raised by the board once the test has what it needs: it ends the waiting constructor's thread."""


@pytest.fixture
def offline_status(tmp_path, monkeypatch):
    """What a captioner replica whose weights are not there (an empty directory) publishes on the load
    board after its first failed load, while it waits in its constructor to retry."""
    published: list[ComponentStatus] = []
    done = threading.Event()

    class FakeLoadBoard:
        def publish(self, status: ComponentStatus) -> None:
            if done.is_set():
                raise StopWaiting
            published.append(status)

        def clear(self) -> None:
            pass

    monkeypatch.setattr(load_board, "this_replica", FakeLoadBoard)
    model = ModelConfig(name="cap", local_path=str(tmp_path))

    def construct() -> None:
        with contextlib.suppress(StopWaiting):
            VisionCaptioner.func_or_class(model, Lifecycle(load_retry_s=30))  # type: ignore[attr-defined]

    thread = threading.Thread(target=construct, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not published and time.monotonic() < deadline:
        time.sleep(0.05)
    yield published[0]
    done.set()


async def health_body(
    view: DeploymentView,
    handle: Any = None,
    last_reason: str | None = None,
    waiting: ComponentStatus | None = None,
) -> dict[str, Any]:
    client = ClientWithFakeServe(view, ProxyVisionConfig(), waiting)
    if handle is not None:
        client.handle = handle
    client._last_reason = last_reason
    body, status = await HealthService(FakeDecoder(), client, model_name="echo").report()
    assert status == 200
    return body


async def test_health_and_the_ready_line_say_the_replicas_state_model_retry_and_cause_once(offline_status, tmp_path):
    body = await health_body(WAITING, waiting=offline_status)
    captioner = body["components"]["captioner"]
    assert body["status"] == "degraded" and not captioner["ready"] and captioner["model"] == "cap", captioner
    details = captioner["details"]
    assert details["state"] == "failed" and details["attempts"] == 1 and details["next_retry_at"], details
    assert details["replicas"] == {"STARTING": 1}, details
    assert captioner["reason"].count(str(tmp_path)) == 1, captioner["reason"]
    line = vision_state(body)
    assert line.startswith(f"degraded (cap failed, attempt 1, next at {details['next_retry_at']}: ValueError: "), line
    assert line.count(str(tmp_path)) == 1 and "\n" not in line, line


async def test_health_from_serves_view_names_the_model_and_the_cause_once():
    """A replacement starting after a real failure: Serve's words already hold the loader's error,
    which the last caption call also reported: said once."""
    cause = "ValueError: It looks like the config file at '/m/config.json' is not a valid JSON file."
    serve_words = (
        f"Serve reports VisionCaptioner UNHEALTHY: ... CaptionerUnavailable: captioner 'cap' cannot load: {cause}"
    )
    view = DeploymentView(
        "UNHEALTHY", serve_words, {"STARTING": 1}, f"Serve application 'vision' is UNHEALTHY: {cause}"
    )
    body = await health_body(view, last_reason=f"captioner 'cap' is not loaded ({cause})")
    captioner = body["components"]["captioner"]
    assert captioner["model"] == "cap" and captioner["details"]["state"] == "failed", captioner
    assert captioner["reason"].count("not a valid JSON") == 1, captioner["reason"]
    assert vision_state(body).startswith("degraded (cap failed: no replica running yet (1 STARTING)")


def test_status_sh_prints_the_ready_lines_vision_state(tmp_path):
    captioner = {
        "ready": False,
        "model": "llava-interleave-qwen-0.5b",
        "reason": "OSError: We couldn't connect to 'https://huggingface.co' to load the files.",
        "details": {"state": "failed", "attempts": 2, "next_retry_at": "2026-11-27T13:45:07Z"},
    }
    body = {"status": "degraded", "components": {"decoder": {"ready": True}, "captioner": captioner}}

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {
            **os.environ,
            "MMSERVE_URL": f"http://127.0.0.1:{server.server_port}",
            "RAY_DASHBOARD_ADDRESS": "http://127.0.0.1:9",  # no Ray there: `serve status` fails, the rest runs
            "HOME": str(tmp_path),
        }
        out = subprocess.run(
            [str(ROOT / "scripts/status.sh")], env=env, capture_output=True, text=True, timeout=240, check=True
        ).stdout
    finally:
        server.shutdown()
    assert out.splitlines()[-1] == f"vision: {vision_state(body)}", out
    assert out.splitlines()[-1] == (
        "vision: degraded (llava-interleave-qwen-0.5b failed, attempt 2, next at 2026-11-27T13:45:07Z: "
        "OSError: We couldn't connect to 'https://huggingface.co' to load the files.)"
    )
