"""The models behind the endpoint: each primary's answer core (`answer.core.AnswerCore`, which every
endpoint's service frames), its `HealthService` and model card, found by the `model` a request
names (404 `model_not_found` for any other), and /health over all of them."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from deployments.errors import InvalidRequestError, ModelNotFoundError
from deployments.ingress.answer.core import AnswerCore
from deployments.ingress.embedding.core import EmbeddingCore
from deployments.ingress.health import HealthService
from deployments.protocol.openai.common import ModelCard, ModelList


@dataclass(frozen=True)
class ServedModel:
    card: ModelCard
    core: AnswerCore
    health: HealthService


@dataclass(frozen=True)
class ServedEmbedder:
    card: ModelCard
    core: EmbeddingCore


class ServedModels:
    """The served models by name, in order: the first is the default model; then the embedding models."""

    def __init__(self, models: Sequence[ServedModel], embedders: Sequence[ServedEmbedder] = ()) -> None:
        if not models:
            raise ValueError("an endpoint serves at least one model")
        self._models = {model.card.id: model for model in models}
        self._embedders = {embedder.card.id: embedder for embedder in embedders}
        self.cards = ModelList(data=[model.card for model in models] + [e.card for e in embedders])

    @property
    def names(self) -> list[str]:
        return [*self._models, *self._embedders]

    def _unknown(self, name: str) -> ModelNotFoundError:
        available = ", ".join(repr(n) for n in self.names)
        return ModelNotFoundError(f"The model {name!r} does not exist. Available: {available}.", param="model")

    def get(self, name: str) -> ServedModel:
        """A chat model; an embedding model's name is a 400 (it only embeds)."""
        model = self._models.get(name)
        if model is None and name in self._embedders:
            raise InvalidRequestError(
                f"The model {name!r} is an embedding model: it answers /v1/embeddings only.", param="model"
            )
        if model is None:
            raise self._unknown(name)
        return model

    def card(self, name: str) -> ModelCard:
        """The card of any served model, chat or embedding."""
        served = self._models.get(name) or self._embedders.get(name)
        if served is None:
            raise self._unknown(name)
        return served.card

    def embedder(self, name: str) -> ServedEmbedder:
        """An embedding model; a chat model's name is a 400 (it embeds nothing)."""
        embedder = self._embedders.get(name)
        if embedder is None and name in self._models:
            embedding = ", ".join(repr(n) for n in self._embedders) or "none is configured"
            raise InvalidRequestError(
                f"The model {name!r} is a chat model, not an embedding model (embedding models: {embedding}).",
                param="model",
            )
        if embedder is None:
            raise self._unknown(name)
        return embedder

    async def health(self) -> tuple[dict[str, Any], int]:
        """One model: its /health body and code. Several: the default model's components at the top
        (as with one), each model's body under `models`, `ok` when all are, `unavailable` (503) when
        no decoder serves, else `degraded`: the endpoint still answers some models.
        Each embedding model's replica status is under `components.embedders`; one that is not ready
        makes an `ok` endpoint `degraded` (chat still answers)."""
        reports, embedders = await asyncio.gather(
            asyncio.gather(*(model.health.report() for model in self._models.values())),
            asyncio.gather(*(embedder.core.status() for embedder in self._embedders.values())),
        )
        if len(reports) == 1:
            body, code = reports[0]
        else:
            code = 200 if any(code == 200 for _, code in reports) else 503
            everything_ok = all(body["status"] == "ok" for body, _ in reports)
            overall = "unavailable" if code == 503 else ("ok" if everything_ok else "degraded")
            models = {name: body for name, (body, _) in zip(self._models, reports, strict=True)}
            body = {"status": overall, "components": reports[0][0]["components"], "models": models}
        if embedders:
            body["components"] = {
                **body["components"],
                "embedders": {
                    name: status.model_dump() for name, status in zip(self._embedders, embedders, strict=True)
                },
            }
            if body["status"] == "ok" and not all(status.ready for status in embedders):
                body["status"] = "degraded"
        return body, code
