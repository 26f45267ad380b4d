"""The default transformers decoder: continuous batching on a paged-attention KV cache.

One `ContinuousBatchingManager` per replica runs a background thread that steps one batch: new
requests join it at the next step (their prompts prefilled in chunks of `prefill_chunk_size`
tokens), finished and cancelled ones leave it, and every step's tokens are handed back to the
replica's event loop, where each request's stream picks up its own.

Sampling is per request in one manager: every request brings its own temperature, top-k and
top-p, and `PerRequestSampler` draws the tokens, leaving the manager an argmax. Greedy
(temperature 0) is top-k 1, an exact argmax, so a temperature is never divided by zero; a step
whose sequences are all greedy, unconstrained and unpenalized is only the argmax. A seeded request
draws from its own generator, and a penalized one is penalized over its own tokens
(`row_sampling.RowSampling`), next to the others in the same step.

Per-request constraints (`constraints.py`: logprobs, logit bias, a JSON grammar) run in the same
sampler, row by row, next to unconstrained sequences in the same step: the sampler learns which
request each row is from `prepare_tensor_args` (the manager passes it every scheduled request; only
those with a new token have a row, in that order; a prompt chunk that is not its prompt's last has
none), finds its constraints in a registry the request's stream fills, applies them, and once the
row's token is known (the argmax for greedy rows, the draw for sampled ones) advances its grammar and
records its logprobs. A grammar's end allows only EOS, so the sequence ends there.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import queue
from collections.abc import AsyncIterator
from typing import Any

import torch
from transformers import ContinuousBatchingConfig, GenerationConfig
from transformers.generation.continuous_batching.cb_logits_processors import (
    ContinuousBatchingLogitsProcessor,
    ContinuousBatchingLogitsProcessorList,
    ContinuousBatchingTopKLogitsWarper,
)
from transformers.generation.continuous_batching.requests import FutureRequestState

from deployments.config import ModelConfig
from deployments.engines.transformers.constraints import RequestConstraints, constrain
from deployments.engines.transformers.row_sampling import RequestRegistry, RowSampling, draw
from deployments.engines.transformers.sampling import Sampling
from deployments.engines.transformers.stream import TokenStream
from deployments.engines.transformers.text import TransformersTextEngine
from deployments.errors import DecoderUnavailable
from deployments.protocol.replica import GenerateRequest

logger = logging.getLogger("ray.serve")

PAGE_SIZE = 256  # tokens per KV-cache page (the library's default)
DEFAULT_BATCH_TOKENS = 512


class PerRequestSampler(ContinuousBatchingLogitsProcessorList):
    """The manager's warpers (temperature, top-k, top-p: two full-vocabulary sorts per token) and the
    draw, so that the manager's own sampler (`do_sample` off) only takes an argmax. A step whose
    sequences are all greedy (top-k 1), unconstrained and unpenalized leaves the scores as they are:
    an argmax, with no sorts, softmax or draw (a quarter more throughput on CPU at 8 sequences).
    Otherwise penalized rows are penalized, constrained rows get their logprobs recorded, bias and
    grammar mask applied; each row is warped by its request's knobs and becomes a one-hot on a token
    drawn from it (from its own generator when seeded; a greedy row draws its argmax), or, when every
    row is greedy, stays for the manager's argmax.

    The manager hands over one row per scheduled request, but only the first rows (those of requests
    with a new token, in order) are real; the others (prompt chunks that are not their prompt's last)
    are read from position 0 and discarded: they are left alone."""

    def __init__(
        self,
        processors: Any,
        registry: RequestRegistry[RequestConstraints],
        samplings: RequestRegistry[RowSampling],
    ) -> None:
        super().__init__(processors, per_request_processors=True)
        per_request = [p for p in self.logits_processor if isinstance(p, ContinuousBatchingLogitsProcessor)]
        self._top_k_row = next(
            i for i, p in enumerate(per_request) if isinstance(p, ContinuousBatchingTopKLogitsWarper)
        )
        self._registry = registry
        self._samplings = samplings
        self._rows: list[RequestConstraints | None] = []
        self._row_samplings: list[RowSampling | None] = []

    def prepare_tensor_args(
        self, requests_in_batch: list[FutureRequestState], arg_storage: torch.Tensor
    ) -> torch.Tensor:
        ids = [r.state.request_id for r in requests_in_batch if r.has_new_token]
        self._rows = self._registry.lookup(ids)
        self._row_samplings = self._samplings.lookup(ids)
        return super().prepare_tensor_args(requests_in_batch, arg_storage)

    def __call__(self, input_ids: Any, scores: torch.Tensor, logits_processor_args: torch.Tensor) -> torch.Tensor:
        rows = len(self._rows)
        own = [(i, s) for i, s in enumerate(self._row_samplings) if s is not None]
        for i, sampling in own:
            sampling.penalize(scores[i])
        step = constrain(scores, self._rows)
        if bool((logits_processor_args[self._top_k_row, :rows] == 1).all()):
            if step is not None or own:  # the manager's argmax, taken here too for grammars, logprobs, penalties
                self._chose(scores[:rows].argmax(dim=-1), step, own)
            return scores
        warped = super().__call__(input_ids, scores[:rows], logits_processor_args)
        probs = warped.softmax(dim=-1)
        drawn = torch.multinomial(probs, num_samples=1)
        for i, sampling in own:
            if sampling.generator is not None:
                drawn[i, 0] = draw(probs[i], sampling.generator)
        self._chose(drawn[:, 0], step, own)
        chosen = torch.full_like(scores, float("-inf"))
        chosen[:rows].scatter_(-1, drawn, 0.0)
        return chosen

    @staticmethod
    def _chose(tokens: torch.Tensor, step: Any, own: list[tuple[int, RowSampling]]) -> None:
        """Each row's token is known (one per real row): grammars, logprobs and penalty counts learn it."""
        if step is not None:
            step.accept(tokens[step.indices])
        if own:
            chosen = tokens.tolist()
            for i, sampling in own:
                sampling.chose(chosen[i])


class ContinuousBatchingTextEngine(TransformersTextEngine):
    """The default transformers decoder (`batching: continuous`)."""

    def __init__(self, model: ModelConfig) -> None:
        super().__init__(model, attn_implementation="sdpa")  # the manager moves it to paged (or flash) attention
        self.kv_bytes_per_token = self._kv_bytes_per_token()
        self.num_blocks = self._num_blocks()
        self.batch_tokens = self.params.prefill_chunk_size or DEFAULT_BATCH_TOKENS
        # The manager takes an argmax of what `PerRequestSampler` leaves. The sampling values below only
        # make the temperature, top-k and top-p steps exist; every request passes its own (`_knobs`).
        generation = GenerationConfig(do_sample=False, max_new_tokens=self.params.max_tokens, **self.special)
        warpers = GenerationConfig(do_sample=True, temperature=0.5, top_k=50, top_p=0.5)
        batching = ContinuousBatchingConfig(
            page_size=PAGE_SIZE,
            num_blocks=self.num_blocks,
            max_batch_tokens=self.batch_tokens,
            max_requests_per_batch=self.params.max_num_seqs,
            per_request_processors=True,
            # The sampler runs Python per step (constraints, the greedy check): no captured graphs, and
            # no step prepared while the previous one still samples (it would overwrite the row map).
            use_cuda_graph=False,
            use_async_batching=False,
        )
        self._manager = self.model.init_continuous_batching(
            generation_config=generation, continuous_batching_config=batching
        )
        # Read by the batch processor that `start` creates.
        self._constraints: RequestRegistry[RequestConstraints] = RequestRegistry()
        self._samplings: RequestRegistry[RowSampling] = RequestRegistry()
        self._manager.logit_processor = PerRequestSampler(
            self.model._get_logits_processor(warpers), self._constraints, self._samplings
        )
        self._manager.start()
        self._ids = itertools.count()

    def _kv_bytes_per_token(self) -> int:
        cfg = self.model.config.get_text_config()
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        return int(2 * cfg.num_hidden_layers * kv_heads * head_dim * self.model.dtype.itemsize)

    def _num_blocks(self) -> int:
        """KV-cache pages: `mem` MB, or room for `max_num_seqs` sequences of `max_model_len` tokens."""
        if self.params.mem:
            budget = self.params.mem * 2**20
        else:
            budget = self.params.max_num_seqs * self.max_model_len * self.kv_bytes_per_token
        return max(1, budget // (self.kv_bytes_per_token * PAGE_SIZE))

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "kv_cache_mb": self.num_blocks * PAGE_SIZE * self.kv_bytes_per_token // 2**20,
            "kv_cache_tokens": self.num_blocks * PAGE_SIZE,
            "batch_tokens": self.batch_tokens,
            "attention": self.model.config._attn_implementation,
        }

    def close(self) -> None:
        self._manager.stop(block=True, timeout=10)
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

    def _knobs(self, sampling: Sampling) -> dict[str, Any]:
        """Per-request sampling arguments of the manager (greedy is top-k 1)."""
        if sampling.greedy:
            return {"temperature": 1.0, "top_k": 1, "top_p": 1.0}
        top_k = min(sampling.top_k, self.vocab_size) if sampling.top_k else self.vocab_size
        return {"temperature": float(sampling.temperature), "top_k": top_k, "top_p": float(sampling.top_p)}

    async def start(self, request: GenerateRequest) -> TokenStream:
        prepared = await self.prepare(request)
        sampling = self.sampling(request)
        knobs = self._knobs(sampling)
        own = RowSampling.of(None if sampling.greedy else request.seed, *self.penalties(request))
        if (failure := self.failure()) is not None:
            raise DecoderUnavailable(failure)
        request_id = f"seq-{next(self._ids)}"

        async def tokens() -> AsyncIterator[list[int]]:
            outputs: asyncio.Queue = asyncio.Queue()
            finished, seen = False, 0
            try:
                self._manager.register_result_handler(request_id, outputs.put_nowait)
                if prepared.constraints is not None:  # before the sequence can be scheduled
                    self._constraints.add(request_id, prepared.constraints)
                if own is not None:
                    self._samplings.add(request_id, own)
                accepted = self._manager.add_request(
                    prepared.prompt, request_id=request_id, max_new_tokens=prepared.max_tokens, streaming=True, **knobs
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
                    yield new
            finally:
                if not finished:  # stop string, client gone or error: free the sequence's slot and pages now
                    self._manager.cancel_request(request_id)
                    with self._manager.output_router._lock:  # a cancelled request gets no final output
                        self._manager.output_router.result_handlers.pop(request_id, None)
                self._constraints.remove(request_id)
                self._samplings.remove(request_id)
                self._drop_orphans()

        return TokenStream(
            tokens(), len(prepared.prompt), prepared.max_tokens, prepared.constraints, prepared.dropped_prompt_tokens
        )

    def _drop_orphans(self) -> None:
        """Outputs that a cancelled sequence produced after its handler was removed go to the manager's
        shared queue, which this engine never reads: dropped here, or they pile up for the replica's
        life (one or two per cancelled request, found by the soak in docs/reliability.md)."""
        orphans = self._manager.output_router.output_queue
        with contextlib.suppress(queue.Empty):
            while True:
                orphans.get_nowait()


def _kv_cache_usage(cache: Any) -> float:
    """KV-cache pages in use / pages in total, as vLLM counts them. The paged cache hands out sectors
    of pages to its allocators and keeps each one's free pages; a finished request's complete pages
    stay cached for prefix reuse until needed, and count as free (they are evicted on demand)."""
    pool = cache.pool
    free_sectors = float(pool.num_free_sectors)
    for allocator in cache.cache_allocators.values():
        per_sector = pool.blocks_per_sector[allocator.index]
        if per_sector:
            free_pages = pool.count_free_blocks(allocator.index) + len(allocator.ledger.cached_blocks)
            free_sectors += free_pages / per_sector
    return max(0.0, min(1.0, 1 - free_sectors / pool.num_sectors)) if pool.num_sectors else 0.0
