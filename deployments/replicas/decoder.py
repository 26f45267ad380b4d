"""PrimaryDecoder: the GPU-pinned LLM. Streams `GenerateChunk`s back through its handle; stop
strings (`stopping`) and `stream_interval_ms` are applied here, engines know nothing of them; the
first chunk of a request with tools says the engine's tool-call format. A
request whose chat the engine truncated to fit the context (`context_overflow: truncate`) gets one
log line here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing

from ray import serve

from deployments.config import Lifecycle, ModelConfig
from deployments.engines import TextEngine, create_text_engine
from deployments.engines.admission import Sequences
from deployments.errors import DecoderUnavailable, ModelNotFoundError
from deployments.merge import MergedStreams
from deployments.monitoring.metrics import DECODER_METRICS, ENGINE_METRICS, DecoderRequestTimer, Recorder
from deployments.protocol.openai.common import TokenLogprob
from deployments.protocol.replica import ComponentStatus, GenerateChunk, GenerateRequest, TokenizedPrompt, TokenizeInput
from deployments.replicas.adapters import ReplicaAdapters
from deployments.replicas.lifecycle import EngineSlot
from deployments.replicas.stopping import StopMatcher
from deployments.roles import Role
from deployments.routing.held import HeldPrefixes
from deployments.routing.keys import BLOCK_CHARS, prefix_blocks

logger = logging.getLogger("ray.serve")


@serve.deployment  # its options are the builder's (deployments/options/)
class PrimaryDecoder:
    """The decoder deployment: one served model's replica, streaming its generations to the ingress."""

    def __init__(self, model: ModelConfig, lifecycle: Lifecycle) -> None:
        self._model = model.name
        # The replica's recorder; a test or a benchmark may swap it for its own.
        self.metrics = Recorder(DECODER_METRICS + ENGINE_METRICS, model.name, tags={"role": Role.DECODER})
        self.metrics.export_zeros()
        self._queued = 0  # requests waiting for one of the `max_num_seqs` slots
        self._cache_counts: dict[str, int] = {}  # the processor cache's totals at the last tick
        lora = model.params.lora
        self._adapters = None if lora is None else ReplicaAdapters(model, lora, lambda: self._slot.engine, self.metrics)
        self._slot: EngineSlot[TextEngine] = EngineSlot(
            Role.DECODER,
            model.name,
            lambda: create_text_engine(model),
            unavailable=DecoderUnavailable,
            lifecycle=lifecycle,
            sample=self._sample,
        )
        # Without its decoder the service has nothing to serve: fail the deployment loudly.
        if not self._slot.load():
            raise RuntimeError(f"primary decoder {model.name!r} failed to load: {self._slot.reason}")
        self._slot.start()
        # What the engine keeps of recent prompts, reported to the routers (`record_routing_stats`).
        memory = self._slot.engine.prefix_memory() if self._slot.engine is not None else None
        self._held = None if memory is None else HeldPrefixes(*memory)
        # `max_num_seqs` sequences at once; the others wait by priority (vLLM's), then in arrival order,
        # and background work (batch lines) runs on idle capacity.
        self._seqs = Sequences(model.params.max_num_seqs)
        self._interval_s = model.params.stream_interval_ms / 1000

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        """The request's sequences, `n` of them, each chunk tagged with its sequence's `index`.
        With a seed, sequence i samples with seed + i, so that the choices differ. A call with a
        multiplexed model id (the ingress's, for a LoRA adapter) generates with that adapter, loaded
        first if this replica does not hold it (`adapters.ReplicaAdapters`).
        """
        adapter = serve.get_multiplexed_model_id() or None
        if self._held is not None:  # as the router keys it: under the adapter, tokens guessed from characters
            blocks = prefix_blocks(request, adapter)
            self._held.served(blocks, len(blocks) * BLOCK_CHARS // 4)
        if adapter is None:
            async with aclosing(self._sequences(request)) as chunks:
                async for chunk in chunks:
                    yield chunk
            return
        if self._adapters is None:
            raise ModelNotFoundError(f"The model {self._model!r} serves no LoRA adapters ({adapter!r}).", param="model")
        await self._adapters.acquire(adapter)
        try:
            async with aclosing(self._sequences(request.model_copy(update={"adapter": adapter}))) as chunks:
                async for chunk in chunks:
                    yield chunk
        finally:
            await self._adapters.release(adapter)

    async def _sequences(self, request: GenerateRequest) -> AsyncGenerator[GenerateChunk, None]:
        if request.n == 1:
            async with aclosing(self._sequence(request, 0)) as chunks:
                async for chunk in chunks:
                    yield chunk
            return
        sequences = [
            self._sequence(
                request.model_copy(update={"n": 1, "seed": None if request.seed is None else request.seed + i}), i
            )
            for i in range(request.n)
        ]
        merged = MergedStreams(sequences)
        try:
            async for chunk in merged:
                yield chunk
        finally:
            await merged.aclose()

    async def _sequence(self, request: GenerateRequest, index: int) -> AsyncGenerator[GenerateChunk, None]:
        timer = DecoderRequestTimer(self.metrics)
        outcome: str | None = None  # the finish reason, "error", or None: closed early (cancelled)
        try:
            self._queued += 1
            waiting = True
            try:
                async with self._seqs.reserve(1, request.priority, request.tenant, request.tenant_share):
                    self._queued, waiting = self._queued - 1, False
                    queued_s: float | None = timer.admitted()
                    async with aclosing(self._stream(request, timer)) as chunks:  # closed at once: frees the sequence
                        async for chunk in chunks:
                            outcome = chunk.finish_reason
                            chunk.index, chunk.queued_s, queued_s = index, queued_s, None  # told once
                            if chunk.truncated_prompt_tokens and index == 0:  # once per request
                                logger.info(
                                    "model %s: chat truncated to fit the context: %d prompt tokens of earlier turns "
                                    "dropped, %d kept",
                                    self._model,
                                    chunk.truncated_prompt_tokens,
                                    chunk.prompt_tokens,
                                )
                            yield chunk
            finally:
                if waiting:
                    self._queued -= 1
        except Exception:
            outcome = "error"
            raise
        finally:
            timer.finished(outcome)

    async def _stream(
        self, request: GenerateRequest, timer: DecoderRequestTimer
    ) -> AsyncGenerator[GenerateChunk, None]:
        """One sequence: stop strings cut its text (not before `min_tokens` tokens; the stop string kept
        with `include_stop_str_in_output`), and text (with its tokens' logprobs) is held back
        until `stream_interval_ms` has passed since the last chunk. Logprobs include the token that
        completed a stop string.
        """
        async with self._slot.use() as engine, aclosing(engine.generate(request)) as pieces:
            tool_format = engine.tool_format if request.tools else None  # told once, on the first chunk
            stop = StopMatcher(request.stop, include=request.include_stop_str_in_output)
            pending, send_at = "", 0.0  # text held back until `send_at` (stream_interval_ms)
            logprobs: list[TokenLogprob] = []  # those of the tokens not yet sent
            wants_logprobs = request.logprobs is not None
            async for piece in pieces:
                timer.piece(piece.prompt_tokens, piece.completion_tokens)
                timer.cached_prompt_tokens = piece.cached_prompt_tokens or 0
                logprobs.extend(piece.logprobs)
                # vLLM's min_tokens: no stop string ends the text before that many tokens.
                early = piece.completion_tokens < request.min_tokens and piece.finish_reason is None
                text = pending + (piece.text if early else stop.feed(piece.text))
                if piece.finish_reason is not None:
                    text += stop.flush()
                finish = "stop" if stop.stopped else piece.finish_reason
                if finish is None:
                    pending = text
                    if text and (now := time.monotonic()) >= send_at:
                        yield GenerateChunk(
                            text=text,
                            logprobs=logprobs if wants_logprobs else None,
                            tool_format=tool_format,
                            prompt_tokens=piece.prompt_tokens,
                            completion_tokens=piece.completion_tokens,
                            cached_prompt_tokens=piece.cached_prompt_tokens,
                        )
                        pending, send_at, logprobs, tool_format = "", now + self._interval_s, [], None
                    continue
                yield GenerateChunk(
                    tool_format=tool_format,
                    text=text,
                    finish_reason=finish,
                    prompt_tokens=piece.prompt_tokens,
                    completion_tokens=piece.completion_tokens,
                    logprobs=logprobs if wants_logprobs else None,
                    truncated_prompt_tokens=piece.truncated_prompt_tokens,
                    cached_prompt_tokens=piece.cached_prompt_tokens,
                    stop_sequence=stop.matched,
                )
                return  # closes the engine's stream: a stop string cancels the sequence at once

    async def tokenize(self, request: TokenizeInput) -> TokenizedPrompt:
        """The prompt's tokens as the engine would prompt with them (/tokenize, count_tokens). It takes
        none of the `max_num_seqs` slots: the engine's tokenizer, in a worker thread, beside them.
        """
        async with self._slot.use() as engine:
            return await asyncio.to_thread(engine.tokenize, request)

    async def detokenize(self, tokens: list[int]) -> str:
        """Token ids as the model's text (/detokenize); an id outside the vocabulary is a 400."""
        async with self._slot.use() as engine:
            return await asyncio.to_thread(engine.detokenize, tokens)

    def _sample(self) -> None:
        """Gauges, once a second (the engine slot's tick)."""
        engine = self._slot.engine
        stats = engine.stats() if engine is not None else {}
        self.metrics.set("engine_loaded", float(self._slot.state == "ready"))
        self.metrics.set("num_requests_running", stats.get("running", 0))
        self.metrics.set("num_requests_waiting", stats.get("waiting", 0) + self._queued)
        self.metrics.set("kv_cache_usage_perc", stats.get("kv_cache_usage", 0.0))
        if self._adapters is not None:
            self.metrics.set("lora_adapters_held", len(self._adapters.held))
        self._count_processor_cache(stats.get("processor_cache"))

    def _count_processor_cache(self, cache: dict | None) -> None:
        """Native vision: the processor cache's hits and misses since the last tick, as counters."""
        if not cache:
            return
        for kind in ("hits", "misses"):
            delta = cache[kind] - self._cache_counts.get(kind, 0)
            if delta > 0:
                self.metrics.inc(f"processor_cache_{kind}", delta)
            self._cache_counts[kind] = cache[kind]

    def status(self) -> ComponentStatus:
        """The engine slot's status. Its `waiting` also counts the requests waiting in this replica
        for one of the `max_num_seqs` slots (as the num_requests_waiting gauge does): the engine
        only sees the sequences let in, so a full batch with more behind it would show none waiting.
        """
        status = self._slot.status()
        if self._adapters is not None:
            status.details["lora_adapters_held"] = len(self._adapters.held)  # names are callers': not on an open page
        if "waiting" in status.details:
            status.details["waiting"] += self._queued
        return status

    def record_routing_stats(self) -> dict:
        """Serve asks every `deployment.routing.stats_period_s`; the routers (`routing.PrefixRouter`)
        read it: the prefix blocks this replica's engine still holds (`HeldPrefixes.report`).
        """
        return {} if self._held is None else self._held.report()

    def check_health(self) -> None:
        """An engine that can no longer generate (its batching thread died) gets the replica restarted."""
        engine = self._slot.engine
        if engine is not None and (failure := engine.failure()) is not None:
            raise RuntimeError(f"decoder engine failed: {failure}")

    def stop(self) -> None:
        """Stop the engine slot's tick and unload the engine (also when the replica is collected)."""
        self._slot.stop()

    def __del__(self) -> None:
        self.stop()
