"""TextEmbedder: an embedding model's replica (CPU, or a GPU share), behind /v1/embeddings.

A request's texts are tokenized here, each input is checked (`engines.embedding.fit_input`: ids in
the vocabulary, the length within `max_input_tokens`, cut or refused), and its inputs join the
inputs of concurrent requests in the model's batches (`Batcher`: up to `embedding.max_batch_size` in
one forward pass; an idle model waits `batch_wait_ms` for company). Tokenizing and the forward pass
run in worker threads, so the event loop keeps queueing the next batch while one runs. Vectors leave
as float32 bytes, cut to the request's `dimensions` where the entry allows it.

Like the decoder, a replica whose model cannot load fails its start loudly (an embedding model named
in models.yaml is part of the service).
"""

from __future__ import annotations

import asyncio
import struct
import time

from ray import serve

from deployments.config import EmbeddingConfig, Lifecycle, ModelConfig
from deployments.engines import EmbedEngine, create_embed_engine
from deployments.engines.batcher import Batcher
from deployments.engines.embedding import check_dimensions, fit_input, shorten
from deployments.errors import EmbedderUnavailable, InvalidRequestError
from deployments.monitoring.metrics import EMBEDDER_METRICS, ENGINE_METRICS, Recorder
from deployments.protocol.replica import ComponentStatus, EmbedRequest, EmbedResult
from deployments.replicas.lifecycle import EngineSlot
from deployments.roles import Role


@serve.deployment  # its options are the builder's (deployments/options/)
class TextEmbedder:
    """The embedder deployment: one embedding model's replica, embedding inputs in batches."""

    def __init__(self, model: ModelConfig, lifecycle: Lifecycle) -> None:
        self._config = model.embedding or EmbeddingConfig()
        # The replica's recorder; a test or a benchmark may swap it for its own.
        self.metrics = Recorder(EMBEDDER_METRICS + ENGINE_METRICS, model.name, tags={"role": Role.EMBEDDER})
        self.metrics.export_zeros()
        self.batches: list[int] = []  # sizes of the last batches, for /health and tests
        self._slot: EngineSlot[EmbedEngine] = EngineSlot(
            Role.EMBEDDER,
            model.name,
            lambda: create_embed_engine(model),
            unavailable=EmbedderUnavailable,
            lifecycle=lifecycle,
            sample=self._sample,
        )
        if not self._slot.load():
            raise RuntimeError(f"embedding model {model.name!r} failed to load: {self._slot.reason}")
        self._slot.start()
        self._batcher: Batcher[list[int], list[float]] = Batcher(
            self._embed_batch, self._config.max_batch_size, self._config.batch_wait_ms / 1000
        )

    async def embed(self, request: EmbedRequest) -> EmbedResult:
        started = time.monotonic()
        if len(request.inputs) > self._config.max_inputs_per_request:
            raise InvalidRequestError(
                f"{len(request.inputs)} inputs; this model takes at most {self._config.max_inputs_per_request} "
                "per request (embedding.max_inputs_per_request).",
                param="input",
            )
        async with self._slot.use() as engine:
            size = check_dimensions(request.dimensions, engine.dimensions, self._config)
            texts = [item for item in request.inputs if isinstance(item, str)]
            tokens = await asyncio.to_thread(engine.tokenize, texts) if texts else request.inputs
            fitted = [
                fit_input(
                    list(ids),  # type: ignore[arg-type]
                    i,
                    limit=engine.max_input_tokens,
                    vocab_size=engine.vocab_size,
                    overflow=self._config.overflow,
                )
                for i, ids in enumerate(tokens)
            ]
            vectors = await asyncio.gather(*(self._batcher.submit(ids) for ids in fitted))
            normalize = engine.normalize
        prompt_tokens = sum(len(ids) for ids in fitted)
        self.metrics.observe("embed_latency_seconds", time.monotonic() - started)
        self.metrics.inc("embed_input_tokens", prompt_tokens)
        packed = [_pack(shorten(vector, size, normalize)) for vector in vectors]
        return EmbedResult(vectors=packed, prompt_tokens=prompt_tokens)

    async def _embed_batch(self, items: list[list[int]]) -> list[list[float]]:
        async with self._slot.use() as engine:
            vectors = await asyncio.to_thread(engine.embed, items)
        self.batches = [*self.batches[-99:], len(items)]
        self.metrics.observe("embed_batch_size", len(items))
        return vectors

    def status(self) -> ComponentStatus:
        status = self._slot.status()
        status.details["last_batch_sizes"] = self.batches[-10:]
        return status

    def _sample(self) -> None:
        self.metrics.set("engine_loaded", float(self._slot.state == "ready"))

    def __del__(self) -> None:
        self._slot.stop()


def _pack(vector: list[float]) -> bytes:
    return struct.pack(f"<{len(vector)}f", *vector)
