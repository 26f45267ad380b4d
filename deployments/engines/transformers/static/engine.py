"""`batching: static`: a decoder of our own for transformers causal LMs (Llama, Qwen2, Qwen3,
Mistral, SmolLM shapes), the default for a transformers text model on a GPU.

A request holds one of `max_num_seqs` slots of a static KV cache for its life (`SlotCache`);
more wait, first come first served, for a slot to come free. A slot keeps its last sequence's tokens
after it ends (`slots.SlotTable`, llama.cpp's slot reuse): a request whose prompt starts as a free
slot holds takes that slot and prefills from there, and its usage's `cached_tokens` says how many
prompt tokens it reused (`enable_prefix_caching`; a request with a seed is computed whole, as on
llama.cpp, so that its answer does not depend on what ran before). One host thread runs the loop: each
turn it takes new and cancelled requests, prefills up to `prefill_chunk_size` prompt tokens (the
prompts cut in chunks, so that running streams keep getting tokens beside a long prompt), then runs
one decode step for every sequence with a slot and a token (`StaticDecoder`: a CUDA graph per batch
and window bucket on a GPU, the same step eagerly on a CPU). Each turn's tokens reach the event
loop in one hand-off; the streams detokenize over a window (`stream.WindowedText`).

Sampling is per request, as in continuous batching (`batch_sampler.BatchSampler`, inside the
captured step): temperature, top-k, top-p, min-p, seeds, penalties, logit bias, JSON grammar and
logprobs. A stream closed early (stop string, client gone) frees its slot at the next turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import queue
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from deployments.config import ModelConfig
from deployments.engines.transformers.batch_sampler import BatchSampler
from deployments.engines.transformers.static.buckets import bucket
from deployments.engines.transformers.static.decoder import Chunk, DecodeRow, StaticDecoder
from deployments.engines.transformers.static.slots import SlotTable
from deployments.engines.transformers.stream import TokenStream, WindowedText
from deployments.engines.transformers.text import TransformersTextEngine
from deployments.errors import ConfigError, DecoderUnavailable
from deployments.protocol.replica import GenerateRequest

logger = logging.getLogger("ray.serve")

ARCHITECTURES = frozenset({"llama", "qwen2", "qwen3", "mistral"})  # attention modules that pass kwargs through
DEFAULT_CHUNK_TOKENS = 512
_END = object()  # a sequence's last hand-off


@dataclass(eq=False)
class _Sequence:
    """One request on the loop's side."""

    request_id: str
    prompt: list[int]
    max_tokens: int
    deliver: Callable[[Any], None]  # puts on the request's queue; called on its event loop
    loop: asyncio.AbstractEventLoop
    slot: int = -1
    reuse: bool = True  # may start from what its slot holds (not with a seed)
    cached: int | None = None  # prompt tokens its slot held already (None: no slot reuse); set when admitted
    prefilled: int = 0
    written: int = 0  # its slot's positions whose K/V it wrote (or reused): those of `held()`
    generated: int = 0
    token: int = 0  # the last token, the next decode step's input
    position: int = 0  # where that token's K/V goes
    new: list[int] = field(default_factory=list)  # tokens not yet handed to the event loop
    output: list[int] = field(default_factory=list)  # every generated token
    ended: bool = False
    adapter: str | None = None  # its LoRA adapter; None: the base model

    def held(self) -> list[int]:
        """The tokens whose K/V it wrote in its slot: its prompt as far as prefilled, then each
        generated token fed to a decode step (the last one never is).
        """
        return (self.prompt + self.output)[: self.written]


class StaticTextEngine(TransformersTextEngine):
    """The static-slot decoder (`batching: static`, and `auto` on a GPU)."""

    TEXT = WindowedText

    def __init__(self, model: ModelConfig) -> None:
        super().__init__(model, attn_implementation="sdpa")
        model_type = self.model.config.get_text_config().model_type
        if model_type not in ARCHITECTURES:
            raise ConfigError(
                f"model {model.name!r}: batching: static runs {sorted(ARCHITECTURES)} models, not {model_type!r}; "
                "use batching: continuous"
            )
        slots = self.params.max_num_seqs
        self.kv_bytes_per_token = self._kv_bytes_per_token()
        if self.params.mem:  # the slots share the budget: each gets an equal length
            fitted = self.params.mem * 2**20 // ((slots + 1) * self.kv_bytes_per_token)
            if fitted < 16:
                raise ConfigError(f"model {model.name!r}: mem {self.params.mem} MB leaves no room for {slots} slots")
            self.max_model_len = min(self.max_model_len, int(fitted))
        cuda = self.device.startswith("cuda")
        self.sampler = BatchSampler(self.vocab_size, slots, slots=2 * slots, device=self.model.device, static=cuda)
        self.decoder = StaticDecoder(
            self.model,
            self.sampler,
            slots=slots,
            max_len=self.max_model_len,
            chunk_tokens=self.params.prefill_chunk_size or DEFAULT_CHUNK_TOKENS,
            capture=cuda and self.adapters is None,  # a captured step would run without the adapters' hooks
            compiled=cuda and self.params.compile_level > 0,
        )
        self._slots = SlotTable(slots, reuse=self.params.enable_prefix_caching)
        self._inbox: queue.SimpleQueue[tuple[str, _Sequence | str | None]] = queue.SimpleQueue()
        self._waiting: deque[_Sequence] = deque()
        self._running: list[_Sequence] = []  # in a slot, in the order they came
        self._ended: list[_Sequence] = []  # ended this turn, their last tokens not yet handed over
        self._fatal: BaseException | None = None
        self._stopping = False
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._run, name="static-decoder", daemon=True)
        self._thread.start()
        logger.info("model %s: static decoder %s", model.name, self.decoder.describe())

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "batching": "static",  # also when `auto` chose it
            "attention": "static slots",
            **self.decoder.describe(),
            "sampler": self.sampler.describe(),
        }

    def stats(self) -> dict[str, Any]:
        running, waiting = len(self._running), len(self._waiting)
        return {"running": running, "waiting": waiting, "kv_cache_usage": round(running / self.params.max_num_seqs, 4)}

    def prefix_memory(self) -> tuple[int, int, int | None] | None:
        """Each slot keeps its last prompt (no host prompt cache)."""
        if not self._slots.reuse:
            return None
        return self.params.max_num_seqs, 0, self.kv_bytes_per_token

    def unload_adapter(self, name: str) -> None:
        super().unload_adapter(name)
        self._inbox.put(("forget", name))  # an adapter loaded later under that name is another

    def failure(self) -> str | None:
        if self._fatal is not None:
            return f"static decoder thread failed: {self._fatal!r}"
        if not self._thread.is_alive() and not self._stopping:
            return "static decoder thread is not running"
        return None

    def close(self) -> None:
        self._stopping = True
        self._inbox.put(("stop", None))
        self._thread.join(timeout=30)
        self.decoder.close()
        super().close()

    # ------------------------------------------------------------------ the event loop's side

    async def start(self, request: GenerateRequest) -> TokenStream:
        self.require_adapter(request.adapter)
        prepared = await self.prepare(request)
        params = self.batch_sampling(request)
        if (failure := self.failure()) is not None:
            raise DecoderUnavailable(failure)
        request_id = f"seq-{next(self._ids)}"
        outputs: asyncio.Queue[Any] = asyncio.Queue()
        sequence = _Sequence(
            request_id,
            prepared.prompt,
            prepared.max_tokens,
            outputs.put_nowait,
            asyncio.get_running_loop(),
            adapter=request.adapter,
            reuse=request.seed is None,
        )

        async def tokens() -> AsyncIterator[list[int]]:
            finished = False
            self.sampler.add(request_id, params, prepared.constraints, prepared.prompt)
            try:
                self._inbox.put(("add", sequence))
                while not finished:
                    ids: list[int] = []
                    item = await outputs.get()
                    while True:
                        if isinstance(item, BaseException):
                            raise item
                        if item is _END:
                            finished = True
                        else:
                            ids.extend(item)
                        if outputs.empty():
                            break
                        item = outputs.get_nowait()
                    if ids:
                        yield ids
            finally:
                if not finished:  # stop string, client gone or error: the loop frees its slot
                    self._inbox.put(("cancel", sequence))

        return TokenStream(
            tokens(),
            len(prepared.prompt),
            prepared.max_tokens,
            prepared.constraints,
            prepared.dropped_prompt_tokens,
            cached_prompt_tokens=lambda: sequence.cached,  # set before its first tokens are handed over
        )

    # ------------------------------------------------------------------ the loop (its own thread)

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._take(block=not (self._running or self._waiting))
                if self._stopping:
                    break
                self._admit()
                self._prefill()
                self._decode()
                self._hand_over()
        except BaseException as exc:  # every waiting stream hears of it; failure() tells the replica
            logger.exception("static decoder thread failed")
            self._fatal = exc
            error = DecoderUnavailable(f"The decoder failed: {exc!r}")
            for sequence in [*self._running, *self._waiting]:
                sequence.loop.call_soon_threadsafe(sequence.deliver, error)

    def _take(self, *, block: bool) -> None:
        """New and cancelled requests (waiting for one when nothing runs)."""
        with contextlib.suppress(queue.Empty):
            kind, sequence = self._inbox.get(timeout=None) if block else self._inbox.get_nowait()
            while True:
                if kind == "add" and isinstance(sequence, _Sequence):
                    self._waiting.append(sequence)
                elif kind == "cancel" and isinstance(sequence, _Sequence):
                    self._release(sequence)
                elif kind == "forget" and isinstance(sequence, str):
                    self._slots.forget(sequence)
                kind, sequence = self._inbox.get_nowait()

    def _admit(self) -> None:
        """Waiting sequences into free slots, each into the one that holds most of its prompt; it
        prefills from there (the K/V past that prefix is the slot's last sequence's, never read:
        `SlotCache.attend` masks every key past a query's position).
        """
        while self._waiting and self._slots.free:
            sequence = self._waiting.popleft()
            sequence.slot, reused = self._slots.take(sequence.prompt, sequence.adapter, reuse=sequence.reuse)
            sequence.prefilled = sequence.written = reused
            sequence.cached = reused if self._slots.reuse else None
            self._running.append(sequence)

    def _release(self, sequence: _Sequence) -> None:
        """Out of the loop: its slot back to the free ones (holding what it wrote there), its sampler
        state dropped.
        """
        if sequence in self._running:
            self._running.remove(sequence)
            self._slots.release(sequence.slot, sequence.held())
        elif sequence in self._waiting:
            self._waiting.remove(sequence)
        self.sampler.remove(sequence.request_id)

    def _prefill(self) -> None:
        """Chunks of the prompts not yet prefilled, in arrival order, while the padded chunk fits
        the token budget (the first always goes).
        """
        budget = self.decoder.chunk_tokens
        chunks: list[Chunk] = []
        owners: list[_Sequence] = []
        longest = 0
        for sequence in self._running:
            left = len(sequence.prompt) - sequence.prefilled
            if left <= 0:
                continue
            size = min(left, budget)
            if chunks and (len(chunks) + 1) * max(longest, size) > budget:
                break
            longest = max(longest, size)
            start = sequence.prefilled
            chunks.append(
                Chunk(sequence.request_id, sequence.slot, sequence.prompt[start : start + size], start, size == left)
            )
            owners.append(sequence)
        if not chunks:
            return
        with self.lora_rows([s.adapter for s in owners]):
            tokens = self.decoder.prefill(chunks)
        for sequence, chunk, token in zip(owners, chunks, tokens, strict=True):
            sequence.prefilled += len(chunk.ids)
            sequence.written = sequence.prefilled
            if token is not None:
                sequence.position = len(sequence.prompt)
                self._accept(sequence, token)

    def _decode(self) -> None:
        rows = [s for s in self._running if s.prefilled >= len(s.prompt) and s.generated]
        if not rows:
            return
        steps = [DecodeRow(s.request_id, s.slot, s.token, s.position) for s in rows]
        padding: list[str | None] = [None] * (bucket(self.decoder.batches, len(rows)) - len(rows))
        with self.lora_rows([s.adapter for s in rows] + padding):  # rows of several adapters in one step
            tokens = self.decoder.decode(steps)
        for sequence, token in zip(rows, tokens, strict=True):
            sequence.position += 1
            sequence.written = sequence.position  # the step wrote its input token's K/V
            self._accept(sequence, token)

    def _accept(self, sequence: _Sequence, token: int) -> None:
        sequence.token = token
        sequence.generated += 1
        sequence.new.append(token)
        sequence.output.append(token)
        full = sequence.position + 1 >= self.decoder.cache.max_len  # no room for the next token's K/V
        if token in self.eos_ids or sequence.generated >= sequence.max_tokens or full:
            sequence.ended = True
            self._release(sequence)
            self._ended.append(sequence)

    def _hand_over(self) -> None:
        """This turn's tokens, every sequence's, in one call on each event loop."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Callable[[Any], None], list[int], bool]]] = {}
        for sequence in [*self._running, *self._ended]:
            if sequence.new or sequence.ended:
                by_loop.setdefault(sequence.loop, []).append((sequence.deliver, sequence.new, sequence.ended))
                sequence.new = []
        self._ended = []
        for loop, items in by_loop.items():
            loop.call_soon_threadsafe(_deliver, items)


def _deliver(items: list[tuple[Callable[[Any], None], list[int], bool]]) -> None:
    """On the event loop: each sequence's new tokens, then its end."""
    for deliver, ids, ended in items:
        if ids:
            deliver(ids)
        if ended:
            deliver(_END)


def cuda_default(model: ModelConfig) -> bool:
    """Whether `batching: auto` picks this engine for `model`: a text model of a supported shape on
    one CUDA GPU, unquantized (a CPU keeps continuous batching).
    """
    from deployments.engines.transformers.loading import pick_device, pretrained_kwargs

    if not torch.cuda.is_available() or model.params.quantization in {"bnb-4bit", "bnb-8bit"}:
        return False
    device, placement = pick_device(model.params)
    if not device.startswith("cuda") or placement:  # sharded over several GPUs: not yet
        return False
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model.source, **pretrained_kwargs(model))
    except (OSError, ValueError, KeyError) as exc:
        logger.warning("model %s: config unreadable (%s); continuous batching", model.name, exc)
        return False
    return config.get_text_config().model_type in ARCHITECTURES
