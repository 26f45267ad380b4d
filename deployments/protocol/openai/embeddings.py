"""OpenAI's embeddings (/v1/embeddings): the request (a string, strings, token ids or lists of token ids),
and the `list` of `embedding` objects with its usage, each vector as floats or as base64 of its
little-endian float32 bytes (the official client's default).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from deployments.protocol.openai.common import RequestModel

MAX_TOKEN_ID = 2**31 - 1  # llama.cpp's and torch's token ids are int32: above it nothing can name a token
Text = Annotated[str, Field(min_length=1)]
TokenIds = Annotated[list[Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]], Field(min_length=1)]


class EmbeddingRequest(RequestModel):
    """`POST /v1/embeddings`. Each input is embedded alone (no context between them)."""

    model: str
    input: Text | Annotated[list[Text], Field(min_length=1)] | TokenIds | Annotated[list[TokenIds], Field(min_length=1)]
    encoding_format: Literal["float", "base64"] = Field(
        "float",
        description="float: each embedding a list of numbers; base64: the base64 of its float32 values, "
        "little-endian (what the official client asks for by default, and decodes).",
    )
    dimensions: int | None = Field(
        None,
        gt=0,
        description="The vector size: the model's own, or a smaller size its models.yaml entry lists (Matryoshka).",
    )
    user: str | None = Field(None, description="Accepted and ignored.")

    @property
    def inputs(self) -> list[str] | list[list[int]]:
        """The inputs as a list: texts, or token-id lists."""
        if isinstance(self.input, str):
            return [self.input]
        if isinstance(self.input[0], int):
            return [self.input]
        return self.input


class EmbeddingUsage(BaseModel):
    """The input's tokens."""

    prompt_tokens: int
    total_tokens: int


class Embedding(BaseModel):
    """One input's vector: floats, or base64 of its little-endian float32 bytes."""

    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingList(BaseModel):
    """/v1/embeddings' answer: a vector per input, in order, with the usage."""

    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
