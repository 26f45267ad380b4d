"""The models behind the endpoint: each primary's answer core (`answer.core.AnswerCore`, which every
endpoint's service frames), its `HealthService` and model card, found by the `model` a request
names (404 `model_not_found` for any other), and /health over all of them."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from deployments.errors import ModelNotFoundError
from deployments.ingress.answer.core import AnswerCore
from deployments.ingress.health import HealthService
from deployments.protocol.openai.common import ModelCard, ModelList


@dataclass(frozen=True)
class ServedModel:
    card: ModelCard
    core: AnswerCore
    health: HealthService


class ServedModels:
    """The served models by name, in order: the first is the default model."""

    def __init__(self, models: Sequence[ServedModel]) -> None:
        if not models:
            raise ValueError("an endpoint serves at least one model")
        self._models = {model.card.id: model for model in models}
        self.cards = ModelList(data=[model.card for model in models])

    @property
    def names(self) -> list[str]:
        return list(self._models)

    def get(self, name: str) -> ServedModel:
        model = self._models.get(name)
        if model is None:
            available = ", ".join(repr(n) for n in self._models)
            raise ModelNotFoundError(f"The model {name!r} does not exist. Available: {available}.", param="model")
        return model

    async def health(self) -> tuple[dict[str, Any], int]:
        """One model: its /health body and code. Several: the default model's components at the top
        (as with one), each model's body under `models`, `ok` when all are, `unavailable` (503) when
        no decoder serves, else `degraded`: the endpoint still answers some models."""
        reports = await asyncio.gather(*(model.health.report() for model in self._models.values()))
        if len(reports) == 1:
            return reports[0]
        code = 200 if any(code == 200 for _, code in reports) else 503
        everything_ok = all(body["status"] == "ok" for body, _ in reports)
        overall = "unavailable" if code == 503 else ("ok" if everything_ok else "degraded")
        models = {name: body for name, (body, _) in zip(self._models, reports, strict=True)}
        return {"status": overall, "components": reports[0][0]["components"], "models": models}, code
