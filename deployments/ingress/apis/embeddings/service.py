"""/v1/embeddings (`EmbeddingService`): a request's inputs embedded by the model's replica, through
its `EmbeddingCore`, framed as OpenAI's `list` of `embedding` objects (floats, or base64 of the
float32 bytes), with the usage.
"""

from __future__ import annotations

import base64
import sys
from array import array
from typing import Any

from deployments.ingress.embedding.core import EmbeddingCore
from deployments.monitoring.access_log import RequestRecord
from deployments.protocol.openai.embeddings import EmbeddingRequest


def as_floats(vector: bytes) -> list[float]:
    """Little-endian float32 bytes as numbers."""
    values = array("f", vector)
    if sys.byteorder != "little":
        values.byteswap()
    return values.tolist()


class EmbeddingService:
    """The request logic of /v1/embeddings for one embedding model."""

    def __init__(self, core: EmbeddingCore) -> None:
        self.core = core

    async def create(self, body: EmbeddingRequest, record: RequestRecord) -> dict[str, Any]:
        """The response body (a plain dict: thousands of floats go to JSON without a model per value)."""
        result = await self.core.embed(body.inputs, body.dimensions)
        record.prompt_tokens = result.prompt_tokens
        record.completion_tokens = 0
        encode = (lambda v: base64.b64encode(v).decode("ascii")) if body.encoding_format == "base64" else as_floats
        return {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": encode(vector)}
                for i, vector in enumerate(result.vectors)
            ],
            "model": self.core.model,
            "usage": {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens},
        }
