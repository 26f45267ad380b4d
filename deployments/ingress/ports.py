"""What the ingress's request logic (`ChatService`, `HealthService`) calls on the other components.

Serve's `DeploymentHandle` to the decoder satisfies `DecoderHandle`, `vision.client.CaptionerClient`
satisfies `Captioner`, and so do the unit tests' fakes (tests/unit/ingress/fakes.py)."""

from __future__ import annotations

from typing import Any, Protocol

from deployments.ingress.vision.cache import CacheStats, CaptionCache
from deployments.ingress.vision.collect import ImageInput
from deployments.protocol.replica import ComponentStatus


class RemoteMethod(Protocol):
    """A deployment's method through its handle: ``handle.status.remote()`` (awaitable) or, on a
    streaming handle, ``handle.generate.remote(request)`` (the chunks, a `stream.ChunkStream`)."""

    def remote(self, *args: Any, **kwargs: Any) -> Any: ...


class DecoderHandle(Protocol):
    """The decoder deployment's handle: streaming `generate`, `status`, and the names by which
    Serve's view of it is asked when it is too busy to answer (`serve_status.deployment_status`)."""

    @property
    def app_name(self) -> str: ...

    @property
    def deployment_name(self) -> str: ...

    @property
    def generate(self) -> RemoteMethod: ...

    @property
    def status(self) -> RemoteMethod: ...

    def options(self, *, stream: bool) -> DecoderHandle: ...


class Captioner(Protocol):
    """The captioner as the ingress sees it: captions (`ChatService`), its status and its caption
    cache's figures (`HealthService`)."""

    @property
    def cache(self) -> CaptionCache: ...

    async def caption(self, images: list[ImageInput], stats: CacheStats | None = None) -> list[str]: ...

    async def status(self) -> ComponentStatus: ...
