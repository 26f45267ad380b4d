"""A Ray Serve application with none of the service's code, for `python -m scripts.bench hops --bare`:
an HTTP ingress deployment that answers the same four requests as the service (`GET /v1/models` by
itself; `POST /tokenize` with one call to a second deployment through its handle; a chat, whole or
streamed, as one streamed call to it), with the replica settings the service uses
(`deployments.options.replica.SAME_LOOP`). What it costs is Ray Serve's own path on this machine.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from deployments.options.replica import SAME_LOOP

OPTIONS = {"ray_actor_options": {"num_cpus": 0, "runtime_env": {"env_vars": SAME_LOOP}}}


@serve.deployment(**OPTIONS)
class Echo:
    async def call(self, text: str) -> list[int]:
        return [len(text)]

    async def stream(self, text: str) -> AsyncIterator[str]:
        yield text


@serve.deployment(**OPTIONS)
class Front:
    def __init__(self, echo: DeploymentHandle) -> None:
        self._echo, self._stream = echo, echo.options(stream=True)

    async def __call__(self, request: Request) -> Response:
        if request.url.path == "/v1/models":
            return JSONResponse({"object": "list", "data": []})
        if request.url.path == "/tokenize":
            return JSONResponse({"tokens": await self._echo.call.remote("hi")})
        body = await request.json()
        chunks = self._stream.stream.remote("hi")
        if not body.get("stream"):
            return JSONResponse({"choices": [{"message": {"content": "".join([c async for c in chunks])}}]})

        async def events() -> AsyncIterator[str]:
            async for chunk in chunks:
                yield f"data: {json.dumps({'choices': [{'delta': {'content': chunk}}]})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")


app = Front.bind(Echo.bind())
