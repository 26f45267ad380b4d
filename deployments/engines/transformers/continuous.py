"""The default transformers decoder: continuous batching on a paged-attention KV cache.

One `ContinuousBatchingManager` per replica runs a background thread that steps one batch: new
requests join it at the next step (their prompts prefilled in chunks of `prefill_chunk_size`
tokens), finished and cancelled ones leave it, and every step's tokens are handed back to the
replica's event loop, where each request's stream picks up its own.

Prefix caching (`enable_prefix_caching`: the library's `allow_block_sharing`): the paged cache hashes
each complete page (`PAGE_SIZE` tokens) of a prompt; a finished request's complete pages stay cached
in the free pages until the pages are needed (then all are evicted at once), and a new request whose
prompt starts with them shares them instead of computing them again. The library says neither what it
holds nor what it reused: the engine wraps its cache's `search_prefix_match` (`PrefixMatches`), which
the scheduler calls when it first schedules a request, and reports the tokens matched as usage's
`cached_tokens`. Sliding-window layers share no pages: such a model has no prefix cache.

Sampling is per request in one manager: the manager's own sampler only takes an argmax, of what
`batch_sampler.BatchSampler` leaves, a one-hot on each row's token: every request's temperature,
top-k, top-p, seed, penalties, logit bias, JSON grammar and logprobs applied to the whole step as
tensor ops (see that module).

Captured steps (`cuda_graphs`, `compile_level`; the padding intervals only with either, see
`batching_config`): the manager can replay a step from a CUDA graph
(or run it compiled) at padded batch shapes; the sampler then runs the same kernels for every step
(`static`), reading each row's parameters from the manager's argument rows. `auto` is the
library's rule: graphs when attention needs no mask (flash-attention kernels, used when installed),
since with sdpa every padded step attends over the padded KV length with a dense mask (the reason
`use_cuda_graph=True` ran at a third of the speed on an H200: docs/benchmarks.md). Steps are never
double-buffered (`use_async_batching`): grammars and logprobs need a step's tokens on the host before
the next step is prepared.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import queue
import threading
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any

from transformers import ContinuousBatchingConfig, GenerationConfig
from transformers.generation.continuous_batching.cache import group_layers_by_attn_type

from deployments.config import EngineParams, ModelConfig
from deployments.engines.transformers.batch_sampler import BatchSampler
from deployments.engines.transformers.stream import TokenStream
from deployments.engines.transformers.text import TransformersTextEngine
from deployments.errors import DecoderUnavailable
from deployments.protocol.replica import GenerateRequest

logger = logging.getLogger("ray.serve")

PAGE_SIZE = 256  # tokens per KV-cache page (the library's default)
DEFAULT_BATCH_TOKENS = 512


class ContinuousBatchingTextEngine(TransformersTextEngine):
    """The default transformers decoder (`batching: continuous`)."""

    def __init__(self, model: ModelConfig) -> None:
        super().__init__(model, attn_implementation="sdpa")  # the manager moves it to paged (or flash) attention
        self.kv_bytes_per_token = self._kv_bytes_per_token()
        self.num_blocks = self._num_blocks()
        self.batch_tokens = self.params.prefill_chunk_size or DEFAULT_BATCH_TOKENS
        generation = GenerationConfig(do_sample=False, max_new_tokens=self.params.max_tokens, **self.special)
        batching = batching_config(self.params, self.num_blocks, self.batch_tokens)
        self._manager = self.model.init_continuous_batching(
            generation_config=generation, continuous_batching_config=batching
        )
        resolved = self._manager.continuous_batching_config
        self.cuda_graphs = any(resolved.cuda_graph_booleans)
        compiled = resolved.varlen_compile_config is not None or resolved.decode_compile_config is not None
        # Read by the batch processor that `start` creates; its tokens go to the streams after `after_step`.
        self._sampler = BatchSampler(
            self.vocab_size,
            self.params.max_num_seqs,
            slots=2 * self.params.max_num_seqs,  # the replica admits twice max_num_seqs requests
            device=self.model.device,
            static=self.cuda_graphs or compiled,
        )
        self._manager.logit_processor = self._sampler
        step = self._manager._generation_step

        def generation_step() -> None:
            step()
            self._sampler.after_step()

        self._manager._generation_step = generation_step
        # Block sharing needs every layer on full attention (the library's rule for its allocators).
        full = set(group_layers_by_attn_type(self.model.config.get_text_config())) == {"full_attention"}
        self._matches = PrefixMatches() if self.params.enable_prefix_caching and full else None
        if self._matches is not None:
            self._manager._create_batch_processor = self._matches.watching(self._manager._create_batch_processor)
        self._manager.start()
        # The manager's thread is not a daemon: an engine never closed would keep Python from exiting.
        # Stopped before the interpreter joins its threads, through a weak reference, so that a closed
        # engine's manager (and the model it holds) is not kept alive for the process's life.
        self._stop = _stopper(weakref.ref(self._manager))
        threading._register_atexit(self._stop)  # type: ignore[attr-defined]
        self._ids = itertools.count()

    def _num_blocks(self) -> int:
        """KV-cache pages: `mem` MB, or room for `max_num_seqs` sequences of `max_model_len` tokens."""
        if self.params.mem:
            budget = self.params.mem * 2**20
        else:
            budget = self.params.max_num_seqs * self.max_model_len * self.kv_bytes_per_token
        return max(1, budget // (self.kv_bytes_per_token * PAGE_SIZE))

    @property
    def kv_cache_bytes(self) -> int:
        return self.num_blocks * PAGE_SIZE * self.kv_bytes_per_token

    def prefix_memory(self) -> tuple[int, int, int | None] | None:
        """No slots: a byte budget of pages, the whole paged cache (finished prompts stay in its free
        pages until running requests need them).
        """
        if self._matches is None:
            return None
        return 0, self.kv_cache_bytes, self.kv_bytes_per_token

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "batching": "continuous",  # also when `auto` chose it
            "kv_cache_mb": self.kv_cache_bytes // 2**20,
            "kv_cache_tokens": self.num_blocks * PAGE_SIZE,
            "batch_tokens": self.batch_tokens,
            "attention": self.model.config._attn_implementation,
            "cuda_graphs": self.cuda_graphs,
            "compile_level": self.params.compile_level,
            "sampler": self._sampler.describe(),
        }

    def close(self) -> None:
        self._stop()
        super().close()

    def failure(self) -> str | None:
        fatal = self._manager.background_thread_status.fatal_error
        if fatal is not None:
            return f"continuous batching thread failed: {fatal}"
        if not self._manager.is_running():
            return "continuous batching thread is not running"
        return None

    def stats(self) -> dict[str, Any]:
        processor = self._manager.batch_processor
        if processor is None:
            return {"running": 0, "waiting": 0, "kv_cache_usage": 0.0}
        scheduler = processor.scheduler
        return {
            "running": len(scheduler.active_requests),
            "waiting": len(scheduler.waiting_requests),
            "kv_cache_usage": round(_kv_cache_usage(processor.cache), 4),
        }

    async def start(self, request: GenerateRequest) -> TokenStream:
        prepared = await self.prepare(request)
        params = self.batch_sampling(request)
        if (failure := self.failure()) is not None:
            raise DecoderUnavailable(failure)
        request_id = f"seq-{next(self._ids)}"
        matches = self._matches
        cached: list[int | None] = [None if matches is None else 0]  # read by the stream at each piece

        async def tokens() -> AsyncIterator[list[int]]:
            outputs: asyncio.Queue = asyncio.Queue()
            finished, seen = False, 0
            try:
                if matches is not None:
                    matches.expect(request_id)
                self._manager.register_result_handler(request_id, outputs.put_nowait)
                self._sampler.add(request_id, params, prepared.constraints, prepared.prompt)  # before it's scheduled
                accepted = self._manager.add_request(
                    prepared.prompt, request_id=request_id, max_new_tokens=prepared.max_tokens, streaming=True
                )
                if accepted is None:
                    raise DecoderUnavailable("The decoder is shutting down and accepts no new requests.")
                while not finished:
                    output = await outputs.get()
                    while not outputs.empty():  # outputs are cumulative: when behind, the latest says it all
                        output = outputs.get_nowait()
                    finished = output.is_finished()
                    if output.error is not None:
                        if self.failure() is not None:
                            raise DecoderUnavailable(f"The decoder failed: {output.error}")
                        raise RuntimeError(f"generation failed: {output.error}")
                    new = output.generated_tokens[seen:]
                    seen += len(new)
                    if matches is not None:  # scheduled, so matched, before its first token
                        cached[0] = matches.get(request_id)
                    yield new
            finally:
                if not finished:  # stop string, client gone or error: free the sequence's slot and pages now
                    self._manager.cancel_request(request_id)
                    with self._manager.output_router._lock:  # a cancelled request gets no final output
                        self._manager.output_router.result_handlers.pop(request_id, None)
                self._sampler.remove(request_id)
                if matches is not None:
                    matches.drop(request_id)
                self._drop_orphans()

        return TokenStream(
            tokens(),
            len(prepared.prompt),
            prepared.max_tokens,
            prepared.constraints,
            prepared.dropped_prompt_tokens,
            cached_prompt_tokens=lambda: cached[0],
        )

    def _drop_orphans(self) -> None:
        """Outputs that a cancelled sequence produced after its handler was removed go to the manager's
        shared queue, which this engine never reads: dropped here, or they pile up for the replica's
        life (one or two per cancelled request, found by the soak in docs/reliability.md).
        """
        orphans = self._manager.output_router.output_queue
        with contextlib.suppress(queue.Empty):
            while True:
                orphans.get_nowait()


class PrefixMatches:
    """The prompt tokens the paged cache matched for each live request (its prefix found in cached
    pages), recorded by wrapping the cache's `search_prefix_match`, which the library's scheduler calls
    on the manager's thread when it first schedules a request (again while nothing matched and the
    request could not be scheduled: the last call counts). Only requests the engine `expect`s are
    recorded, until it `drop`s them.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tokens: dict[str, int] = {}
        self._cache: weakref.ref[Any] | None = None  # the cache whose search is wrapped

    def expect(self, request_id: str) -> None:
        with self._lock:
            self._tokens[request_id] = 0

    def found(self, request_id: str, tokens: int) -> None:
        with self._lock:
            if request_id in self._tokens:
                self._tokens[request_id] = tokens

    def get(self, request_id: str) -> int:
        with self._lock:
            return self._tokens.get(request_id, 0)

    def drop(self, request_id: str) -> None:
        with self._lock:
            self._tokens.pop(request_id, None)

    def watching(self, create: Callable[[], Any]) -> Callable[[], Any]:
        """The manager's `_create_batch_processor` (called on its thread as it starts), its paged cache's
        `search_prefix_match` wrapped to record each match.
        """

        def create_watched() -> Any:
            processor = create()
            cache = processor.cache
            if self._cache is None or self._cache() is not cache:  # a reset processor comes back as it was
                search = cache.search_prefix_match

                def search_prefix_match(request_id: str, prompt_ids: list[int]) -> int:
                    matched = int(search(request_id, prompt_ids))
                    self.found(request_id, matched)
                    return matched

                cache.search_prefix_match = search_prefix_match
                self._cache = weakref.ref(cache)
            return processor

        return create_watched


def batching_config(params: EngineParams, num_blocks: int, batch_tokens: int) -> ContinuousBatchingConfig:
    """The manager's configuration. The padding intervals are passed only when graphs or compiling
    are asked for (`cuda_graphs: on`, `compile_level` > 0): transformers reads any non-zero padding as
    a request for CUDA graphs, which would turn them on under `auto` (with sdpa, the configuration
    measured at a third of the eager speed).
    """
    padded = params.cuda_graphs == "on" or params.compile_level > 0
    return ContinuousBatchingConfig(
        page_size=PAGE_SIZE,
        num_blocks=num_blocks,
        max_batch_tokens=batch_tokens,
        max_requests_per_batch=params.max_num_seqs,
        use_cuda_graph={"auto": None, "on": True, "off": False}[params.cuda_graphs],
        q_padding_interval_size=params.graph_q_padding if padded else 0,
        kv_padding_interval_size=params.graph_kv_padding if padded else 0,
        default_compile_level=params.compile_level,
        use_async_batching=False,
        allow_block_sharing=params.enable_prefix_caching,
    )


def _stopper(manager: weakref.ref[Any]) -> Callable[[], None]:
    """Stops the manager if it is still there and running."""

    def stop() -> None:
        running = manager()
        if running is not None and running.is_running():
            running.stop(block=True, timeout=10)

    return stop


def _kv_cache_usage(cache: Any) -> float:
    """KV-cache pages in use / pages in total, as vLLM counts them. The paged cache hands out sectors
    of pages to its allocators and keeps each one's free pages; a finished request's complete pages
    stay cached for prefix reuse until needed, and count as free (they are evicted on demand).
    """
    pool = cache.pool
    free_sectors = float(pool.num_free_sectors)
    for allocator in cache.cache_allocators.values():
        per_sector = pool.blocks_per_sector[allocator.index]
        if per_sector:
            free_pages = pool.count_free_blocks(allocator.index) + len(allocator.ledger.cached_blocks)
            free_sectors += free_pages / per_sector
    return max(0.0, min(1.0, 1 - free_sectors / pool.num_sectors)) if pool.num_sectors else 0.0
