"""An embedding model as the ingress sees it (`EmbeddingCore`): its deployment's handle, its
per-request input limit (checked here, before the call), the vocabulary of its token-id inputs
(OpenAI's cl100k_base ids are decoded to text here, so the replica sees text) and the request's
deadline. A plain class over the handle (or a fake with the same calls), so that
`endpoints.embeddings.EmbeddingService` runs, and is tested, without Ray and without HTTP.
"""

from __future__ import annotations

import asyncio

from deployments.config import TokenIdVocabulary
from deployments.errors import InvalidRequestError, RequestTimeoutError, unwrap
from deployments.ingress.embedding import cl100k
from deployments.ingress.handles import EmbedderHandle
from deployments.protocol.replica import ComponentStatus, EmbedRequest, EmbedResult

STATUS_TIMEOUT_S = 5.0


class EmbeddingCore:
    """An embedding model as the ingress calls it (see the module's docstring)."""

    def __init__(
        self,
        embedder: EmbedderHandle,
        *,
        model_name: str,
        max_inputs: int,
        request_timeout_s: float,
        token_ids: TokenIdVocabulary = "model",
    ) -> None:
        """`max_inputs`: the entry's `embedding.max_inputs_per_request`; `token_ids`: its `embedding.token_ids`."""
        self._embedder = embedder
        self.model = model_name
        self.max_inputs = max_inputs
        self.token_ids = token_ids
        self._timeout_s = request_timeout_s

    async def embed(self, inputs: list[str] | list[list[int]], dimensions: int | None) -> EmbedResult:
        """The vectors of `inputs`, from the model's replica, within the request's deadline."""
        if len(inputs) > self.max_inputs:
            raise InvalidRequestError(
                f"{len(inputs)} inputs; model {self.model!r} takes at most {self.max_inputs} per request "
                "(embedding.max_inputs_per_request).",
                param="input",
            )
        if self.token_ids == "cl100k_base" and isinstance(inputs[0], list):
            # In a worker thread: the first call loads the encoding, and a request may hold many ids.
            inputs = await asyncio.to_thread(cl100k.decode, inputs)
        request = EmbedRequest(inputs=inputs, dimensions=dimensions)
        try:
            async with asyncio.timeout(self._timeout_s):
                return await self._embedder.embed.remote(request)
        except TimeoutError:
            raise RequestTimeoutError(
                f"The request did not finish within {self._timeout_s:g} s (server.request_timeout_s)."
            ) from None

    async def status(self) -> ComponentStatus:
        """The model's replica's own status (/health), or why none answered within 5 s."""
        try:
            return await asyncio.wait_for(self._embedder.status.remote(), STATUS_TIMEOUT_S)
        except Exception as exc:
            cause = unwrap(exc)
            words = f"no status answer within {STATUS_TIMEOUT_S:g}s" if isinstance(cause, TimeoutError) else cause
            return ComponentStatus(ready=False, model=self.model, reason=f"embedder not reachable: {words}"[:500])
