"""An embedding model's settings: the ``embedding:`` section of a models.yaml entry, which makes the
entry an embedding model served at /v1/embeddings by its own deployment (not a chat primary).

Unset, `pooling` and `normalize` come from the model's own files (a sentence-transformers layout:
``modules.json``, ``1_Pooling/config.json``, a ``Normalize`` module; a GGUF file's pooling type), and
`max_input_tokens` from ``sentence_bert_config.json``'s ``max_seq_length`` or the model's positions.
Builder arg ``embedder`` overrides any field, validated together with the file's.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from deployments.config.strict import StrictModel

Pooling = Literal["mean", "cls", "last"]
TokenIdVocabulary = Literal["model", "cl100k_base"]


class EmbeddingConfig(StrictModel):
    """How an embedding model pools, normalises, cuts and batches (``embedding:`` of an entry)."""

    pooling: Pooling | Literal["auto"] = Field(
        "auto",
        description="How token states become one vector: mean (over the non-padding tokens), cls (the first "
        "token), last (the last token: decoder-style embedders). auto: the model's own (sentence-transformers' "
        "1_Pooling/config.json, a GGUF file's pooling type), else mean.",
    )
    normalize: bool | Literal["auto"] = Field(
        "auto",
        description="Scale each vector to unit length (cosine similarity is then a dot product). auto: when the "
        "model's modules.json has a Normalize module (a GGUF model: always).",
    )
    dimensions: list[Annotated[int, Field(gt=0)]] = Field(
        default_factory=list,
        description="Sizes a request's `dimensions` may ask for below the model's own: the vector's first N "
        "values, normalised again (Matryoshka truncation). Only for models trained for it (e.g. nomic-embed, "
        "bge-m3, text-embedding-3 style): truncating another model's vectors loses quality. Empty: `dimensions` "
        "may only repeat the model's own size.",
    )
    max_input_tokens: int | None = Field(
        None,
        gt=0,
        description="Most tokens of one input (special tokens included). Default: the model's max_seq_length "
        "(sentence_bert_config.json), else its position embeddings.",
    )
    overflow: Literal["error", "truncate"] = Field(
        "error",
        description="An input longer than max_input_tokens. error: a 400 context_length_exceeded with the numbers. "
        "truncate: its first max_input_tokens tokens are embedded (the end is dropped, as sentence-transformers does).",
    )
    token_ids: TokenIdVocabulary = Field(
        "model",
        description="The vocabulary that token-id inputs are read in. model: the model's own ids (vLLM's and "
        "llama-server's reading). cl100k_base: OpenAI's encoding, what LangChain's OpenAIEmbeddings and other "
        "OpenAI-tuned clients send by default: the ingress decodes the ids to text with cl100k_base and the "
        "model tokenizes that text (usage and max_input_tokens then count the model's tokens); an id that is "
        "not a cl100k_base token is a 400.",
    )
    max_inputs_per_request: int = Field(
        2048, gt=0, description="Most inputs in one request (OpenAI's limit is 2048); a 400 beyond."
    )
    max_batch_size: int = Field(
        32, gt=0, description="Most inputs in one forward pass; inputs of concurrent requests share batches."
    )
    batch_wait_ms: float = Field(
        2.0,
        ge=0,
        le=1000,
        description="How long an idle replica waits for more inputs to fill a batch before running it.",
    )

    @model_validator(mode="after")
    def _sorted_sizes(self) -> EmbeddingConfig:
        if len(set(self.dimensions)) != len(self.dimensions):
            raise ValueError(f"dimensions: a size is listed twice in {self.dimensions}")
        return self
