"""The base of every models.yaml section."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """A models.yaml section: unknown keys are refused, values are frozen once read."""

    model_config = ConfigDict(extra="forbid", frozen=True)
