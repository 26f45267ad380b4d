"""/v1/models' wire: a served model (or LoRA adapter) and the list of them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from deployments.protocol.openai.common import absent


class ModelCard(BaseModel):
    """A served model (or LoRA adapter) as /v1/models lists it."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "mmserve"
    parent: str | None = Field(None, exclude_if=absent, description="A LoRA adapter's base model (vLLM's field).")


class ModelList(BaseModel):
    """/v1/models' answer."""

    object: Literal["list"] = "list"
    data: list[ModelCard]
