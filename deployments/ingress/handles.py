"""The deployment handles the ingress calls, as Protocols: what its request logic
(`answer.core.AnswerCore`, `HealthService`) calls on the decoder (and `embedding.core.EmbeddingCore`
on an embedding model). Serve's `DeploymentHandle` to it satisfies `DecoderHandle`, and so does the
unit tests' fake (tests/unit/ingress/fakes.py). The captioner's side is `vision.client.Captioner`,
over `CaptionerHandle`.
"""

from __future__ import annotations

from typing import Any, Protocol


class RemoteMethod(Protocol):
    """A deployment's method through its handle: ``handle.status.remote()`` (awaitable) or, on a
    streaming handle, ``handle.generate.remote(request)`` (the chunks, an `answer.stream.ChunkStream`).
    """

    def remote(self, *args: Any, **kwargs: Any) -> Any: ...


class DecoderHandle(Protocol):
    """The decoder deployment's handle: streaming `generate`, `status`, `tokenize` and `detokenize`,
    and the names by which Serve's view of it is asked when it is too busy to answer
    (`serve_status.deployment_view`).
    """

    @property
    def app_name(self) -> str: ...

    @property
    def deployment_name(self) -> str: ...

    @property
    def generate(self) -> RemoteMethod: ...

    @property
    def status(self) -> RemoteMethod: ...

    @property
    def tokenize(self) -> RemoteMethod: ...

    @property
    def detokenize(self) -> RemoteMethod: ...

    def options(self, *, stream: bool, session_id: str = ...) -> DecoderHandle: ...


class EmbedderHandle(Protocol):
    """An embedding model's deployment handle: `embed` (an `EmbedRequest` in, an `EmbedResult` back)
    and `status`. Serve's `DeploymentHandle` satisfies it, and so does the unit tests' fake.
    """

    @property
    def embed(self) -> RemoteMethod: ...

    @property
    def status(self) -> RemoteMethod: ...


class CaptionerHandle(Protocol):
    """A captioner deployment's handle, as `vision.client.CaptionerClient` calls it: `caption` (a
    `CaptionRequest` in, a `CaptionResult` back) and `status`.
    """

    @property
    def caption(self) -> RemoteMethod: ...

    @property
    def status(self) -> RemoteMethod: ...
