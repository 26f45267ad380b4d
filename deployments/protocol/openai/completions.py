"""OpenAI's legacy completions (/v1/completions): a prompt used as it is (text or token ids, no chat
template), and the `text_completion` answer with the legacy logprobs' shape.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationInfo, field_validator

from deployments.protocol.openai.common import FinishReason, SamplingFields, Usage


class CompletionRequest(SamplingFields):
    """The legacy `/v1/completions`: a prompt used as it is, no chat template."""

    prompt: (
        Annotated[str, Field(min_length=1)]
        | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1, max_length=32)]
        | Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
        | Annotated[
            list[Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]], Field(min_length=1, max_length=32)
        ]
    )
    max_tokens: int | None = Field(16, gt=0, description="OpenAI's default for this endpoint is 16.")
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    best_of: int | None = Field(None, ge=1, le=1, description="Only 1 (or null).")
    suffix: None = Field(None, description="Not supported: insertion needs a fill-in-the-middle model.")

    @field_validator("echo")
    @classmethod
    def _echo_without_logprobs(cls, value: bool, info: ValidationInfo) -> bool:
        if value and info.data.get("logprobs") is not None:
            raise ValueError("echo with logprobs is not supported (prompt logprobs are not computed)")
        return value

    @property
    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: a string, or a list of token ids."""
        prompt: Any = self.prompt
        if isinstance(prompt, str) or isinstance(prompt[0], int):
            return [prompt]
        return list(prompt)


class CompletionLogprobs(BaseModel):
    """The legacy endpoint's logprobs: parallel lists, one entry per token."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float] = Field(default_factory=list)
    top_logprobs: list[dict[str, float]] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    """One prompt's (or sample's) text, with its logprobs and how it finished."""

    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReason | None = None


class Completion(BaseModel):
    """OpenAI's `text_completion`: the whole answer, or one chunk of a stream."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
