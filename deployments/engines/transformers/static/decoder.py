"""The device side of the static engine: a causal LM's own modules over a `SlotCache`, the prefill
of prompt chunks and the decode step, with the sampler (`BatchSampler`, tensor ops) in the step.

A decode step reads one int32 device buffer (`inputs`): each row's input token, position and slot,
then the sampler's argument rows (`batch_sampler.Arg`). The host fills the matching pinned buffer
(`host`) and copies it over in one non-blocking copy; the step's tokens come back in one copy to a
pinned output buffer. Rows are padded up to a batch bucket (padding rows point at the scratch slot,
position 0, plain greedy), and the window read up to a window bucket, so that a step runs at one of
a few fixed shapes.

On a GPU (`capture=True`) every (batch, window) bucket is captured at start in a CUDA graph, on a
side stream with one shared memory pool, the model's forward `torch.compile`d first where asked
(`compiled=True`, fullgraph, static shapes); a live step replays its bucket's graph. No capture
ever happens on a live step: a shape without a graph (none, unless the buckets changed) runs eagerly
and is counted (`eager_steps`). On a CPU the same step functions run eagerly: that is how CI tests
them. Prefill chunks run eagerly everywhere (their shapes vary with the prompt).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from deployments.engines.transformers.batch_sampler import BatchSampler
from deployments.engines.transformers.sampler_args import Arg
from deployments.engines.transformers.static.buckets import batch_buckets, bucket, chunk_buckets, window_buckets
from deployments.engines.transformers.static.slot_cache import SlotCache

logger = logging.getLogger("ray.serve")

TOKEN, POSITION, SLOT = 0, 1, 2  # the first rows of the input buffers; the sampler's arguments follow
ARGS = 3


@dataclass(frozen=True)
class Chunk:
    """A piece of one prompt to prefill: `ids` at positions `start`, `start + 1`, ... of `slot`;
    `last`: the prompt's final piece (its last token's logits give the first generated token).
    """

    request_id: str
    slot: int
    ids: Sequence[int]
    start: int
    last: bool


@dataclass(frozen=True)
class DecodeRow:
    """One sequence in a decode step: its last token, to be written at `position` of `slot`."""

    request_id: str
    slot: int
    token: int
    position: int


class StaticDecoder:
    """`model` (a causal LM whose attention modules pass keyword arguments through: Llama, Qwen2,
    Qwen3, Mistral) over a cache of `slots` sequences of `max_len` tokens.
    """

    def __init__(
        self,
        model: Any,
        sampler: BatchSampler,
        *,
        slots: int,
        max_len: int,
        chunk_tokens: int,
        capture: bool = False,
        compiled: bool = False,
    ) -> None:
        self.model, self.sampler = model, sampler
        self.device = torch.device(model.device)
        self.cache = SlotCache(model.config, slots, max_len, model.dtype, self.device)
        self.cache.register(model)
        self.base = model.base_model
        self.head = model.get_output_embeddings()
        self.batches = batch_buckets(slots)
        self.windows = window_buckets(max_len)
        self.chunk_tokens = min(chunk_tokens, max_len)
        self.chunks = chunk_buckets(self.chunk_tokens)
        cuda = self.device.type == "cuda"
        rows = ARGS + len(Arg)
        self.host = torch.zeros(rows, slots, dtype=torch.int32, pin_memory=cuda)
        self._host = self.host.numpy()
        self.inputs = torch.zeros(rows, slots, dtype=torch.int32, device=self.device)
        self.out = torch.zeros(slots, dtype=torch.long, pin_memory=cuda)
        self._done = torch.cuda.Event() if cuda else None
        self._forward = self._logits
        if compiled:
            from torch import _dynamo

            graphs = len(self.batches) * len(self.windows)  # a shape each: one recompile per bucket
            _dynamo.config.recompile_limit = max(_dynamo.config.recompile_limit, graphs + 8)
            self._forward = torch.compile(self._logits, fullgraph=True, dynamic=False)
        self.compiled = compiled
        self.graphs: dict[tuple[int, int], Any] = {}
        self.captures = 0  # graphs captured (all at start)
        self.eager_steps = 0  # decode steps on a GPU that found no graph for their bucket
        self.capture_s = 0.0
        self.graph_mb = 0.0
        self.last_shape = (0, 0)  # the last decode step's (batch, window) buckets
        if capture:
            self.capture_all()

    # ------------------------------------------------------------------ the model's forward

    def _logits(
        self, ids: torch.Tensor, positions: torch.Tensor, write: torch.Tensor, read: torch.Tensor, window: int
    ) -> torch.Tensor:
        """float32 logits of each row's last token (`ids`, `positions`, `write`: `[rows, tokens]`)."""
        hidden = self.base(
            input_ids=ids,
            position_ids=positions,
            use_cache=False,
            slot_write=write,
            slot_read=read,
            slot_positions=positions,
            slot_window=window,
        ).last_hidden_state
        return self.head(hidden[:, -1]).float()

    def _decode(self, batch: int, window: int) -> torch.Tensor:
        """The step on `inputs` (captured as it is on a GPU): logits, then the sampler's tokens."""
        inputs = self.inputs[:, :batch]
        ids = inputs[TOKEN].long().unsqueeze(1)
        positions = inputs[POSITION].long().unsqueeze(1)
        slots = inputs[SLOT].long()
        logits = self._forward(ids, positions, slots.unsqueeze(1), slots, window)
        return self.sampler.choose(logits, inputs[ARGS:])

    # ------------------------------------------------------------------ decode

    def _fill(self, rows: Sequence[DecodeRow], batch: int) -> int:
        """The host buffer for `rows` padded to `batch`; returns the window bucket."""
        host, n = self._host, len(rows)
        host[TOKEN, :batch] = 0
        host[POSITION, :batch] = 0
        host[SLOT, :batch] = self.cache.scratch
        host[TOKEN, :n] = [r.token for r in rows]
        host[POSITION, :n] = [r.position for r in rows]
        host[SLOT, :n] = [r.slot for r in rows]
        self.sampler.prepare_rows([r.request_id for r in rows], self.host[ARGS:], batch)
        return bucket(self.windows, max(r.position for r in rows) + 1)

    def decode(self, rows: Sequence[DecodeRow]) -> list[int]:
        """One decode step for `rows` (at most `slots`, each in its own slot): their next tokens."""
        batch = bucket(self.batches, len(rows))
        window = self._fill(rows, batch)
        self.last_shape = (batch, window)
        self.inputs.copy_(self.host, non_blocking=True)
        graph = self.graphs.get((batch, window))
        if graph is not None:
            graph.replay()
        else:
            if self.graphs:
                self.eager_steps += 1
            with torch.inference_mode():
                self._decode(batch, window)
        return self._tokens(len(rows))

    def decode_logits(self, rows: Sequence[DecodeRow]) -> torch.Tensor:
        """The logits a decode step of `rows` samples from (eager; for checks): it writes their K/V."""
        batch = bucket(self.batches, len(rows))
        window = self._fill(rows, batch)
        self.inputs.copy_(self.host)
        inputs = self.inputs[:, :batch]
        slots = inputs[SLOT].long()
        with torch.inference_mode():
            logits = self._logits(
                inputs[TOKEN].long().unsqueeze(1),
                inputs[POSITION].long().unsqueeze(1),
                slots.unsqueeze(1),
                slots,
                window,
            )
        return logits[: len(rows)]

    def _tokens(self, n: int) -> list[int]:
        """The step's tokens on the host (one copy, one wait), after the sampler's host work."""
        self.out[:n].copy_(self.sampler.tokens[:n], non_blocking=True)
        if self._done is not None:
            self._done.record()
            self._done.synchronize()
        self.sampler.after_step()
        return [int(t) for t in self.out[:n].tolist()]

    # ------------------------------------------------------------------ prefill

    def prefill_logits(self, chunks: Sequence[Chunk]) -> torch.Tensor:
        """Writes the chunks' K/V; the logits of each chunk's last token. The chunks (one per slot)
        are padded to one length, a chunk bucket; the padding tokens write to the scratch slot.
        """
        length = bucket(self.chunks, max(len(c.ids) for c in chunks))
        rows = len(chunks)
        ids = np.zeros((rows, length), dtype=np.int64)
        positions = np.tile(np.arange(length, dtype=np.int64), (rows, 1))
        write = np.full((rows, length), self.cache.scratch, dtype=np.int64)
        for j, c in enumerate(chunks):
            n = len(c.ids)
            ids[j, :n] = c.ids
            positions[j, :n] = np.arange(c.start, c.start + n)
            write[j, :n] = c.slot
        window = bucket(self.windows, max(c.start + len(c.ids) for c in chunks))
        last = torch.tensor([len(c.ids) - 1 for c in chunks], device=self.device)
        tensors = [torch.from_numpy(a).to(self.device) for a in (ids, positions, write)]
        read = torch.tensor([c.slot for c in chunks], device=self.device)
        with torch.inference_mode():
            hidden = self.base(
                input_ids=tensors[0],
                position_ids=tensors[1],
                use_cache=False,
                slot_write=tensors[2],
                slot_read=read,
                slot_positions=tensors[1],
                slot_window=window,
            ).last_hidden_state
            return self.head(hidden[torch.arange(rows, device=self.device), last]).float()

    def prefill(self, chunks: Sequence[Chunk]) -> list[int | None]:
        """Prefills the chunks; a token for each chunk that ends its prompt (sampled as a decode
        step samples), None for the others.
        """
        logits = self.prefill_logits(chunks)
        finals = [j for j, c in enumerate(chunks) if c.last]
        result: list[int | None] = [None] * len(chunks)
        if not finals:
            return result
        self.sampler.prepare_rows([chunks[j].request_id for j in finals], self.host[ARGS:], len(finals))
        self.inputs.copy_(self.host, non_blocking=True)
        with torch.inference_mode():
            self.sampler.choose(logits[finals], self.inputs[ARGS:, : len(finals)])
        for j, token in zip(finals, self._tokens(len(finals)), strict=True):
            result[j] = token
        return result

    # ------------------------------------------------------------------ capture (GPU)

    def capture_all(self) -> None:
        """One CUDA graph per (batch, window) bucket, largest first (the smaller ones reuse the
        pool's memory), on a side stream; each shape warmed up (and compiled) before its capture.
        Only padding rows run: they write to the scratch slot.
        """
        device = self.device
        pool = torch.cuda.graph_pool_handle()
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_reserved(device)
        started = time.perf_counter()
        self._fill_padding()
        self.inputs.copy_(self.host)
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.inference_mode(), torch.cuda.stream(stream):
            for batch in reversed(self.batches):
                for window in reversed(self.windows):
                    for _ in range(2):
                        self._decode(batch, window)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool, stream=stream):
                        self._decode(batch, window)
                    self.graphs[(batch, window)] = graph
                    self.captures += 1
        torch.cuda.current_stream(device).wait_stream(stream)
        torch.cuda.synchronize(device)
        self.capture_s = time.perf_counter() - started
        self.graph_mb = (torch.cuda.memory_reserved(device) - before) / 2**20
        logger.info(
            "static decoder: %d CUDA graphs captured in %.1f s (%s), %.0f MB",
            self.captures,
            self.capture_s,
            "compiled" if self.compiled else "eager kernels",
            self.graph_mb,
        )

    def _fill_padding(self) -> None:
        self._host[:] = 0
        self._host[SLOT] = self.cache.scratch
        self.sampler.prepare_rows([], self.host[ARGS:], self.host.size(1))

    def describe(self) -> dict[str, Any]:
        return {
            "kv_cache_mb": round(self.cache.nbytes / 2**20, 1),
            "slot_len": self.cache.max_len,
            "batch_buckets": list(self.batches),
            "window_buckets": list(self.windows),
            "chunk_buckets": list(self.chunks),
            "graphs": len(self.graphs),
            "compiled": self.compiled,
            "capture_s": round(self.capture_s, 2),
            "graph_mb": round(self.graph_mb, 1),
        }

    def close(self) -> None:
        self.graphs.clear()
        self.cache.unregister()
