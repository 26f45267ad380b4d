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
from deployments.protocol.replica import CaptionRequest, CaptionResult


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

    def __init__(self, view: DeploymentView, vision: ProxyVisionConfig) -> None:
        super().__init__("vision", ModelConfig(name="cap", hf_id="org/cap"), vision)
        self.handle = PendingHandle()
        self.view = view

    def _handle(self) -> Any:
        return self.handle

    async def _serve_view(self) -> DeploymentView:
        return self.view

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
