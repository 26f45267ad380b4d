"""A GGUF embedding model (BERT, nomic-bert, a decoder with last-token pooling: whatever llama.cpp embeds)
on llama.cpp's embedding mode, in the replica's process (xllamacpp) as an `EmbedEngine`: one slot per
input of a batch, each input whole in one compute pass. Its tokenizer is llama.cpp's (the server's
``/tokenize``, special tokens added), so token ids a client sends are the GGUF vocabulary's.
"""

from __future__ import annotations

import logging
from typing import Any

from deployments.config import EmbeddingConfig, ModelConfig
from deployments.config.machine import cpu_cores
from deployments.engines.base import EmbedEngine
from deployments.engines.llamacpp.files import gguf_path
from deployments.engines.llamacpp.gguf_meta import read_metadata
from deployments.engines.llamacpp.server import LlamaServer, ServerSettings

logger = logging.getLogger("ray.serve")

POOLING_TYPES = {1: "mean", 2: "cls", 3: "last"}  # llama.cpp's pooling_type values in a GGUF header
NO_NORMALIZATION, EUCLIDEAN = -1, 2  # llama.cpp's embd_normalize


class LlamaCppEmbedEngine(EmbedEngine):
    """A GGUF embedding model on llama.cpp's embedding mode (see the module's docstring)."""

    device = "cpu"

    def __init__(self, model: ModelConfig) -> None:
        config = model.embedding or EmbeddingConfig()
        self.path = gguf_path(model)
        meta = read_metadata(self.path)
        arch = str(meta.get("general.architecture", "bert"))
        own_pooling = POOLING_TYPES.get(int(meta.get(f"{arch}.pooling_type", 1)), "mean")
        self.pooling = own_pooling if config.pooling == "auto" else config.pooling
        self.normalize = True if config.normalize == "auto" else config.normalize
        context = int(meta.get(f"{arch}.context_length", 512))
        self.max_input_tokens = min(config.max_input_tokens or context, context)
        self.dimensions = int(meta[f"{arch}.embedding_length"])
        self.vocab_size = int(meta["tokenizer.ggml.tokens"])  # an array's value is its length
        threads = model.params.cpu_threads
        self.threads = cpu_cores() if threads in (None, "all") else int(threads)
        self.slots = config.max_batch_size
        self._server = LlamaServer(
            ServerSettings(
                model_path=str(self.path),
                n_parallel=self.slots,
                n_ctx=self.slots * self.max_input_tokens,
                kv_unified=True,
                threads=self.threads,
                n_batch=max(2048, self.max_input_tokens),
                pooling=self.pooling,
                n_ubatch=max(512, self.max_input_tokens),
            )
        )

    def describe(self) -> dict[str, Any]:
        return {
            "engine": "llama.cpp",
            "source": str(self.path),
            "device": self.device,
            "cpu_threads": self.threads,
            "slots": self.slots,
            "pooling": self.pooling,
            "normalize": self.normalize,
            "dimensions": self.dimensions,
            "max_input_tokens": self.max_input_tokens,
        }

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        return [list(self._server.call("/tokenize", {"content": t, "add_special": True})["tokens"]) for t in texts]

    def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        if not inputs:
            return []
        body = {"input": inputs, "embd_normalize": EUCLIDEAN if self.normalize else NO_NORMALIZATION}
        data = sorted(self._server.embeddings(body)["data"], key=lambda item: item["index"])
        return [item["embedding"] for item in data]

    def close(self) -> None:
        self._server.close()
