"""The models behind the endpoint: each primary's answer core (`answer.core.AnswerCore`, which every
endpoint's service frames), its `HealthService` and model card, found by the `model` a request
names (404 `model_not_found` for any other), and /health over all of them.

A primary's LoRA adapters (`AdapterView`) are named as Ray Serve LLM names them,
``<model>:<adapter>``, or by the adapter's own name as vLLM does (when no other model has an adapter
of that name); /v1/models lists each listed adapter as ``<model>:<adapter>`` with `parent` the model.
An adapter the ingress does not list is tried only as ``<model>:<adapter>`` of a model with a
`lora.dynamic_path`: the replica that loads it answers 404 when it is not there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from deployments.config.lora import named_adapter
from deployments.errors import InvalidRequestError, ModelNotFoundError
from deployments.ingress.answer.core import AnswerCore
from deployments.ingress.embedding.core import EmbeddingCore
from deployments.ingress.health import HealthService
from deployments.protocol.openai.models import ModelCard, ModelList


@dataclass(frozen=True)
class AdapterView:
    """A model's LoRA adapters as the ingress serves them: `core` makes an adapter's answer core
    (the decoder's handle with the adapter as Serve's multiplexed model id).
    """

    listed: tuple[str, ...]
    dynamic: bool
    core: Callable[[str], AnswerCore]
    _cores: dict[str, AnswerCore] = field(default_factory=dict, compare=False)

    def get(self, adapter: str) -> AnswerCore:
        """The adapter's core (the listed ones' kept; a dynamic one's made per request)."""
        if adapter in self._cores:
            return self._cores[adapter]
        core = self.core(adapter)
        if adapter in self.listed:
            self._cores[adapter] = core
        return core


@dataclass(frozen=True)
class ServedModel:
    """A served chat model: its card, its answer core, its health and its LoRA adapters (None: none)."""

    card: ModelCard
    core: AnswerCore
    health: HealthService
    adapters: AdapterView | None = None

    def with_adapter(self, adapter: str) -> ServedModel:
        """This model answering with one of its LoRA adapters."""
        assert self.adapters is not None
        card = ModelCard(id=f"{self.card.id}:{adapter}", created=self.card.created, parent=self.card.id)
        return ServedModel(card, self.adapters.get(adapter), self.health)


@dataclass(frozen=True)
class ServedEmbedder:
    """A served embedding model: its card and its core."""

    card: ModelCard
    core: EmbeddingCore


class ServedModels:
    """The served models by name, in order: the first is the default model; then the embedding models."""

    def __init__(self, models: Sequence[ServedModel], embedders: Sequence[ServedEmbedder] = ()) -> None:
        if not models:
            raise ValueError("an endpoint serves at least one model")
        self._models = {model.card.id: model for model in models}
        self._embedders = {embedder.card.id: embedder for embedder in embedders}
        self._listed = {model.card.id: model.adapters.listed if model.adapters else () for model in models}
        self._dynamic = {model.card.id for model in models if model.adapters and model.adapters.dynamic}
        adapter_cards = [
            ModelCard(id=f"{model.card.id}:{adapter}", created=model.card.created, parent=model.card.id)
            for model in models
            for adapter in (model.adapters.listed if model.adapters else ())
        ]
        self.cards = ModelList(data=[model.card for model in models] + adapter_cards + [e.card for e in embedders])

    @property
    def names(self) -> list[str]:
        return [*self._models, *self._embedders]

    def unknown(self, name: str, allowed: Callable[[str], bool] = lambda name: True) -> ModelNotFoundError:
        """The 404 of a model not served, or not `allowed` to the caller (its list names only the allowed)."""
        available = ", ".join(repr(n) for n in self.names if allowed(n))
        return ModelNotFoundError(f"The model {name!r} does not exist. Available: {available}.", param="model")

    def get(self, name: str) -> ServedModel:
        """A chat model; an embedding model's name is a 400 (it only embeds)."""
        model = self._models.get(name) or self._adapter(name)
        if model is None and name in self._embedders:
            raise InvalidRequestError(
                f"The model {name!r} is an embedding model: it answers /v1/embeddings only.", param="model"
            )
        if model is None:
            raise self.unknown(name)
        return model

    def _adapter(self, name: str) -> ServedModel | None:
        """A model with one of its adapters (`config.lora.named_adapter`'s rule)."""
        named = named_adapter(name, self._listed, self._dynamic, self.names)
        return None if named is None else self._models[named[0]].with_adapter(named[1])

    def card(self, name: str) -> ModelCard:
        """The card of any served model, chat or embedding, or a LoRA adapter."""
        served = self._models.get(name) or self._adapter(name) or self._embedders.get(name)
        if served is None:
            raise self.unknown(name)
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
            raise self.unknown(name)
        return embedder

    async def health(self) -> tuple[dict[str, Any], int]:
        """One model: its /health body and code. Several: the default model's components at the top
        (as with one), each model's body under `models`, `ok` when all are, `unavailable` (503) when
        no decoder serves, else `degraded`: the endpoint still answers some models.
        Each embedding model's replica status is under `components.embedders`; one that is not ready
        makes an `ok` endpoint `degraded` (chat still answers).
        """
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
