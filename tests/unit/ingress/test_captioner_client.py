"""`CaptionerClient`'s calls through a real `DeploymentResponse` (Ray Serve's own class, with a
replica-assignment future that never resolves, as while a captioner replica is replaced): a call
given up (Serve reports the captioner down, or the deadline passes) leaves no task whose exception
nobody retrieves. Serve's `DeploymentResponse` turns the cancellation of a cancelled response into
`RequestCancelledError`, so a cancelled call's task ends with that exception, not cancelled; before
the fix every degraded image request left a "Task exception was never retrieved" traceback in the
Ingress's log. No Ray is started."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import hashlib
from typing import Any

import pytest
from ray.serve._private.common import RequestMetadata
from ray.serve.handle import DeploymentResponse

from deployments.config import ModelConfig, ProxyVisionConfig
from deployments.errors import CaptionerTimeout, CaptionerUnavailable
from deployments.ingress.serve_status import DeploymentView
from deployments.ingress.vision.client import CaptionerClient
from deployments.ingress.vision.collect import ImageInput
from deployments.protocol.replica import CaptionRequest, CaptionResult, ComponentStatus


class PendingMethod:
    """A handle method whose calls are real `DeploymentResponse`s that no replica ever answers."""

    def __init__(self) -> None:
        self.responses: list[DeploymentResponse] = []

    def remote(self, *args: Any) -> DeploymentResponse:
        metadata = RequestMetadata(request_id=f"req-{len(self.responses)}", internal_request_id="internal")
        response: DeploymentResponse = DeploymentResponse(concurrent.futures.Future(), metadata)
        self.responses.append(response)
        return response


class PendingHandle:
    def __init__(self) -> None:
        self.caption = PendingMethod()


class ClientWithFakeServe(CaptionerClient):
    """The real client, with Serve's handle and Serve's view of the captioner replaced."""

    def __init__(self, view: DeploymentView, vision: ProxyVisionConfig, waiting: ComponentStatus | None = None) -> None:
        """`waiting`: what a replica waiting for its model published on the load board."""
        super().__init__("vision", ModelConfig(name="cap", hf_id="org/cap"), vision)
        self.handle = PendingHandle()
        self.view = view
        self.waiting = waiting

    def _handle(self) -> Any:
        return self.handle

    async def _serve_view(self) -> tuple[DeploymentView, ComponentStatus | None]:
        return self.view, (None if self.view.running else self.waiting)

    async def _app_state(self) -> str:
        return "Serve application 'vision' is UNHEALTHY"


def image() -> ImageInput:
    data = b"not decoded here"
    return ImageInput(data=data, user_text="what is it?", digest=hashlib.sha256(data).hexdigest())


@pytest.fixture
def loop_errors() -> list[dict[str, Any]]:
    """What the running loop's exception handler receives ("Task exception was never retrieved" among it)."""
    return []


async def settle_and_collect(errors: list[dict[str, Any]]) -> list[str]:
    for _ in range(5):  # let the cancelled calls' tasks finish
        await asyncio.sleep(0)
    gc.collect()  # an unretrieved task reports itself when it is collected
    await asyncio.sleep(0)
    return [str(e.get("message")) + " " + repr(e.get("exception")) for e in errors]


@pytest.mark.parametrize(
    ("view", "timeout_s", "error"),
    [
        (DeploymentView("UNHEALTHY", "Serve reports VisionCaptioner UNHEALTHY"), 30.0, CaptionerUnavailable),
        (DeploymentView("UPDATING", "Serve reports VisionCaptioner UPDATING"), 0.05, CaptionerTimeout),
    ],
    ids=["serve-says-down", "deadline"],
)
async def test_a_call_given_up_leaves_no_unretrieved_task(view, timeout_s, error, loop_errors, monkeypatch):
    loop = asyncio.get_running_loop()
    loop.set_debug(True)
    loop.set_exception_handler(lambda _, context: loop_errors.append(context))
    monkeypatch.setattr("deployments.ingress.vision.client.WATCH_AFTER_S", 0.01)
    client = ClientWithFakeServe(view, ProxyVisionConfig(timeout_s=timeout_s, retry_after_s=0.01))
    for _ in range(3):  # the README's three image requests, each after the last one's retry_after_s
        with pytest.raises(error):
            await client.caption([image()])
        await asyncio.sleep(0.02)
    responses = client.handle.caption.responses
    assert len(responses) == 3 and all(r.cancelled() for r in responses)
    del responses
    never_retrieved = [e for e in await settle_and_collect(loop_errors) if "never retrieved" in e]
    assert never_retrieved == []


class AnsweringMethod:
    """A handle method answered at once by a replica that says it cannot caption."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    async def remote(self, request: CaptionRequest) -> CaptionResult:
        return CaptionResult(unavailable=self.reason)


async def test_a_replica_that_answers_unavailable_degrades_with_its_words():
    view = DeploymentView("HEALTHY", "Serve reports VisionCaptioner HEALTHY")
    client = ClientWithFakeServe(view, ProxyVisionConfig())
    reason = "captioner 'cap' is not loaded (OSError: no weights in /models/cap)"
    client.handle.caption = AnsweringMethod(reason)
    with pytest.raises(CaptionerUnavailable) as raised:
        await client.caption([image()])
    assert not isinstance(raised.value, CaptionerTimeout)
    assert raised.value.message == f"The vision captioner is unavailable: {reason}"
    assert client.reason == reason and client._last_reason == reason  # /health's cause while Serve replaces it


async def test_a_replica_waiting_for_its_model_degrades_image_requests_with_its_words(monkeypatch):
    """No replica runs; the one waiting in its constructor published that its load failed: the first
    call degrades at its first look (not at its deadline), later ones without calling at all, and
    /health's status is the waiting replica's own, with Serve's count of replicas."""
    monkeypatch.setattr("deployments.ingress.vision.client.WATCH_AFTER_S", 0.01)
    view = DeploymentView("UPDATING", "Serve reports VisionCaptioner UPDATING", {"STARTING": 1})
    reason = "OSError: no weights in /models/cap"
    waiting = ComponentStatus(
        ready=False, model="cap", reason=reason, details={"state": "failed", "attempts": 2, "next_retry_at": "x"}
    )
    client = ClientWithFakeServe(view, ProxyVisionConfig(timeout_s=30, retry_after_s=0.01), waiting)
    with pytest.raises(CaptionerUnavailable) as raised:
        await client.caption([image()])
    assert not isinstance(raised.value, CaptionerTimeout) and raised.value.message.endswith(reason)
    await asyncio.sleep(0.02)  # past retry_after_s: the next call looks before it calls
    with pytest.raises(CaptionerUnavailable, match=reason):
        await client.caption([image()])
    assert len(client.handle.caption.responses) == 1
    status = await client.status()
    assert not status.ready and status.reason == reason
    assert status.details == {"state": "failed", "attempts": 2, "next_retry_at": "x", "replicas": {"STARTING": 1}}


async def test_a_replica_still_on_its_first_load_makes_calls_wait():
    """Loading, not failed (nothing published yet): a call waits for the replica, up to its deadline."""
    view = DeploymentView("UPDATING", "Serve reports VisionCaptioner UPDATING", {"STARTING": 1})
    loading = ComponentStatus(ready=False, model="cap", reason="loading", details={"state": "loading"})
    client = ClientWithFakeServe(view, ProxyVisionConfig(timeout_s=0.05), loading)
    with pytest.raises(CaptionerTimeout):
        await client.caption([image()])
