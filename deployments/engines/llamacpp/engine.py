"""`LlamaCppTextEngine`: a GGUF model on llama.cpp's server code, in the replica's process.

One engine is one llama.cpp server with `max_num_seqs` slots: llama.cpp batches the running slots
in every decode step (continuous batching: a request joins at the next step, its prompt in chunks
of `n_batch` tokens). Each request is one streamed completion, run on a thread of this engine's
pool (xllamacpp's call blocks until its stream ends); its chunks reach the event loop through a
`ThreadStream`. Closing the generator (a stop string, the client gone) makes the next chunk's callback
answer "stop", and llama.cpp cancels the task and frees the slot at once: one decode step later,
or after the prompt's prefill when it is still in it.

The prompt is always token ids, counted before the request starts: a chat rendered by the GGUF's
own chat template (llama.cpp's Jinja engine, ``/apply-template``) and tokenized by llama.cpp
(``/tokenize``, with the special tokens the model adds), fitted by `context.fit_context` (a 400
with the numbers, or `context_overflow: truncate`); a legacy completion's text tokenized the same
way, or its token ids, as they are. Generated text comes back raw (no tool-call or reasoning
parsing by llama.cpp): the ingress parses tool calls as for every engine.

KV cache: its layout and cell type are `kv_cache.py`'s (a stream per slot, or one shared pool; f16
or q8_0 cells, and what `batch_invariant` costs). llama.cpp has no preemption, so a batch that
outgrew the pool would fail every sequence in it: each request reserves its prompt and completion
budget in the pool first, and waits while they do not fit; and a prompt enters while the prompts
still in prefill leave it room in `n_batch` tokens, first come first served (by `priority` first),
so that a burst of long prompts is answered in order instead of all late (`engines/admission.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deployments.config import ModelConfig
from deployments.engines.admission import Budget
from deployments.engines.base import EngineOutput, TextEngine
from deployments.engines.bridge import ThreadStream
from deployments.engines.context import fit_rendered
from deployments.engines.defaults import limits as request_limits
from deployments.engines.llamacpp.files import gguf_path
from deployments.engines.llamacpp.gguf_meta import describe_gguf
from deployments.engines.llamacpp.kv_cache import kv_cache_type, kv_layout
from deployments.engines.llamacpp.params import LlamaCppError, StopIds, completion_body, read_chunk, token_logprobs
from deployments.engines.llamacpp.prompts import LlamaCppPrompts
from deployments.engines.llamacpp.server import LlamaServer, ServerSettings
from deployments.engines.llamacpp.settings import llama_threads, lora_ids
from deployments.engines.load_log import LoadLog, size_text
from deployments.errors import ConfigError, DecoderUnavailable, InvalidRequestError
from deployments.protocol.replica import GenerateRequest
from deployments.roles import Role
from deployments.tools.prompt import resolve_tool_format

logger = logging.getLogger("ray.serve")

DEFAULT_CONTEXT = 4096  # a GGUF file that does not say its training context
LLAMA_N_BATCH = 2048  # llama.cpp's default n_batch: the prefill budget when prefill_chunk_size is unset


@dataclass(frozen=True)
class Prepared:
    """A request ready for llama.cpp: its prompt's tokens (image tokens included), the completion
    body, and the prompt tokens that truncation dropped.
    """

    prompt_tokens: int
    body: dict[str, Any]
    dropped_prompt_tokens: int = 0


class LlamaCppTextEngine(LlamaCppPrompts, TextEngine):
    """A text decoder; `LlamaCppVisionEngine` (`vision.py`) extends it with images, through the hooks
    `projector_file`, `_prepare`, `_stream` and `_read`.
    """

    device = "cpu"
    takes_images = False

    def __init__(self, model: ModelConfig, role: Role = Role.DECODER) -> None:
        if model.capabilities.vision_mode == "native" and not self.takes_images:
            raise ConfigError(
                f"model {model.name!r}: vision_mode native on llama.cpp is LlamaCppVisionEngine's (with mmproj_file)"
            )
        progress = LoadLog(role, model)
        self.name, self.params = model.name, model.params
        self.lora_ids = lora_ids(model)
        self.path = gguf_path(model, progress)
        self.projector = self.projector_file(model, progress)
        started = time.monotonic()
        shape = describe_gguf(self.path)
        own_len = shape.context_length or DEFAULT_CONTEXT
        self.max_model_len = min(self.params.max_model_len or own_len, own_len)
        self.kv_cache_type = kv_cache_type(self.params)
        self.kv_bytes_per_token = shape.kv_bytes_per_token(self.kv_cache_type)
        self.kv_cells, self.kv_unified = kv_layout(self.params, self.max_model_len, self.kv_bytes_per_token)
        if self.params.batch_invariant and self.kv_unified:
            raise ConfigError(
                f"model {model.name!r}: batch_invariant needs a stream of KV cells per slot, and mem: "
                f"{self.params.mem} MB is below {self.params.max_num_seqs} slots x {self.max_model_len} tokens "
                f"({size_text(self.params.max_num_seqs * self.max_model_len * (self.kv_bytes_per_token or 0))}): "
                "raise mem or drop it, lower max_num_seqs or max_model_len, or set batch_invariant false"
            )
        self.batch_invariant = self.params.batch_invariant
        self.cpu_threads, self.cpu_threads_batch = llama_threads(self.params)
        # xllamacpp's call holds a thread for a whole stream: one per slot, and as many again for
        # cancelled streams that wait for their next token to stop.
        self.streams = 2 * self.params.max_num_seqs
        if model.mmproj_file and self.projector is None:
            logger.warning("model %s: mmproj_file is loaded for vision_mode native only; ignored", self.name)
        if os.environ.get("CUDA_VISIBLE_DEVICES"):
            logger.warning(
                "model %s: engine llama.cpp computes on the CPU (the PyPI xllamacpp wheel is CPU-only), but this "
                "replica holds GPU(s) %s: give it none (deployment.num_gpus: 0)",
                self.name,
                os.environ["CUDA_VISIBLE_DEVICES"],
            )
        try:
            self._server = LlamaServer(
                ServerSettings(
                    model_path=str(self.path),
                    n_parallel=self.params.max_num_seqs,
                    n_ctx=self.kv_cells,
                    kv_unified=self.kv_unified,
                    threads=self.cpu_threads,
                    threads_batch=self.cpu_threads_batch,
                    n_batch=self.params.prefill_chunk_size,
                    mmproj_path=None if self.projector is None else str(self.projector),
                    http_streams=self.streams if self.takes_images else 0,
                    kv_cache_type=self.kv_cache_type,
                    lora_paths=tuple(model.params.lora.adapters.values()) if model.params.lora else (),
                    cache_ram_mib=self.prompt_cache_mib,
                )
            )
        except BaseException as exc:
            progress.failed("step=load", started, exc)
            raise
        props = self._server.call("/props")
        self.supports_tools = bool(props.get("chat_template_caps", {}).get("supports_tools"))
        template = str(props.get("chat_template") or "")
        self.tool_format = resolve_tool_format(
            model.capabilities.tool_call_format, self.supports_tools, template, model.name
        )
        meta = (self._server.call("/v1/models").get("data") or [{}])[0].get("meta", {})
        self.vocab_size = int(meta.get("n_vocab") or shape.vocab_size or 0)
        self._pool = ThreadPoolExecutor(self.streams, thread_name_prefix="llamacpp")
        self._live: dict[int, list[int]] = {}  # request -> [prompt tokens, completion tokens so far]
        # slots with a pool of their own never wait; a shared pool holds a slot's worth back for a key with none running
        self._room = Budget(self.kv_cells, self.kv_cells // self.params.max_num_seqs) if self.kv_unified else None
        self._prefill = Budget(self.params.prefill_chunk_size or LLAMA_N_BATCH)  # prompt tokens in prefill
        self._ids = itertools.count()
        self._closed = False
        kv_mb = "" if self.kv_bytes_per_token is None else f", {size_text(self.kv_cells * self.kv_bytes_per_token)}"
        progress.step(
            "load",
            time.monotonic() - started,
            f"llama.cpp server in this process: {shape.architecture or 'unknown'} GGUF as it is, "
            f"{self.params.max_num_seqs} slots, {self.kv_cells} KV cells"
            f"{kv_mb} ({'one shared pool' if self.kv_unified else f'{self.max_model_len} per slot'}), "
            f"{self.kv_cache_type} cells, {self.cpu_threads} threads ({self.cpu_threads_batch} for batched steps), "
            f"{self.prompt_cache_text()}; "
            "greedy answers "
            f"{'independent of the load (batch_invariant)' if self.batch_invariant else 'may change with the load'}",
        )
        progress.finished()

    @property
    def prompt_cache_mib(self) -> int:
        """The host-memory prompt cache's bound in MiB (0: none; none without prefix caching)."""
        return self.params.cache_ram_mib if self.params.enable_prefix_caching else 0

    def prefix_memory(self) -> tuple[int, int, int | None] | None:
        if not self.params.enable_prefix_caching:
            return None
        return self.params.max_num_seqs, self.prompt_cache_mib * 2**20, self.kv_bytes_per_token

    def prompt_cache_text(self) -> str:
        mib = self.prompt_cache_mib
        return f"a prompt cache of up to {mib} MiB in host memory" if mib else "no host prompt cache"

    def projector_file(self, model: ModelConfig, progress: LoadLog) -> Path | None:
        """The multimodal projector llama.cpp loads beside the model: none for text."""
        return None

    # ------------------------------------------------------------------ engine contract

    def describe(self) -> dict[str, Any]:
        import xllamacpp

        kv_mb = None if self.kv_bytes_per_token is None else self.kv_cells * self.kv_bytes_per_token // 2**20
        return {
            **self.params.model_dump(),
            "engine": "llama.cpp",
            "xllamacpp": xllamacpp.__version__,
            "source": str(self.path),
            "device": self.device,
            "max_model_len": self.max_model_len,
            "slots": self.params.max_num_seqs,
            "kv_cache_tokens": self.kv_cells,
            "kv_cache_mb": kv_mb,
            "prompt_cache_mb": self.prompt_cache_mib,
            "kv_unified": self.kv_unified,
            "kv_cache_type": self.kv_cache_type,
            "cpu_threads": self.cpu_threads,
            "cpu_threads_batch": self.cpu_threads_batch,
            "vocab_size": self.vocab_size,
            "tool_call_format": self.tool_format,
        }

    def stats(self) -> dict[str, Any]:
        """Sequences in llama.cpp's slots and waiting for one, the KV cells they hold (cells of
        finished prompts that llama.cpp keeps for prefix reuse count as free: they are reused), and the
        host prompt cache's bound.
        """
        live = list(self._live.values())
        slots = self.params.max_num_seqs
        held = sum(prompt + completion for prompt, completion in live[:slots])
        return {
            "running": min(len(live), slots),
            "waiting": max(len(live) - slots, 0) + self._prefill.waiting + (self._room.waiting if self._room else 0),
            "kv_cache_usage": round(min(held / self.kv_cells, 1.0), 4) if self.kv_cells else 0.0,
            "prompt_cache_mb": self.prompt_cache_mib,  # /health: the host memory it may take
        }

    def failure(self) -> str | None:
        return "the llama.cpp server was closed" if self._closed else None

    def close(self) -> None:
        self._closed = True
        self._pool.shutdown(wait=False)  # a stream queued meanwhile ends with DecoderUnavailable
        self._server.close()

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[EngineOutput, None]:
        if self._closed:
            raise DecoderUnavailable("The llama.cpp engine was closed.")
        prepared = await asyncio.to_thread(self._prepare, request)
        need = prepared.prompt_tokens + int(prepared.body.get("n_predict") or self.max_model_len)
        priority = request.priority
        room = (
            self._room.reserve(need, priority, request.tenant, request.tenant_share)
            if self._room is not None
            else contextlib.nullcontext()
        )
        async with room, self._prefill.reserve(prepared.prompt_tokens, priority, request.tenant) as prefilled:
            key = next(self._ids)
            prompt_tokens = prepared.prompt_tokens
            live = self._live[key] = [prompt_tokens, 0]
            k = request.logprobs
            stops = StopIds(frozenset(request.stop_token_ids), request.include_stop_str_in_output)
            try:
                with ThreadStream[dict[str, Any]](_request_error) as chunks:

                    def on_chunk(chunk: dict[str, Any]) -> bool:
                        if chunks.cancelled.is_set():
                            return True  # llama.cpp cancels the task and frees the slot
                        chunks.send(chunk)
                        return False

                    def produce() -> None:
                        if not chunks.cancelled.is_set():
                            self._stream(prepared.body, on_chunk)

                    self._pool.submit(chunks.run, produce)
                    tokens = 0
                    async for chunk in chunks:
                        prefilled()  # its first token: the next prompt may start
                        try:
                            piece = self._read(chunk)
                        except LlamaCppError as exc:
                            raise _request_error(exc) from None
                        tokens = piece.tokens if piece.tokens is not None else tokens + max(len(piece.logprobs), 1)
                        live[1] = tokens
                        logprobs = token_logprobs(piece.logprobs, k) if k is not None else ()
                        if stops.ids and piece.finish is None:
                            text, counted, stopped = stops.cut(piece.text, piece.logprobs)
                            if stopped:  # returning closes the stream: llama.cpp cancels the task
                                tokens += counted - len(piece.logprobs)
                                yield EngineOutput(
                                    text,
                                    tokens,
                                    prompt_tokens,
                                    finish_reason="stop",
                                    logprobs=logprobs[:counted],
                                    truncated_prompt_tokens=prepared.dropped_prompt_tokens,
                                    cached_prompt_tokens=piece.cached,
                                )
                                return
                        if piece.finish is not None:
                            if piece.prompt_tokens not in (None, prompt_tokens):  # the context was checked on ours
                                counts = (self.name, piece.prompt_tokens, prompt_tokens)
                                logger.warning("model %s: llama.cpp counted %s prompt tokens, the engine %s", *counts)
                            yield EngineOutput(
                                piece.text,
                                tokens,
                                piece.prompt_tokens or prompt_tokens,  # llama.cpp's own count where it says it
                                finish_reason=piece.finish,
                                logprobs=logprobs,
                                truncated_prompt_tokens=prepared.dropped_prompt_tokens,
                                cached_prompt_tokens=piece.cached,
                            )
                            return
                        if piece.text or logprobs:
                            dropped = prepared.dropped_prompt_tokens
                            yield EngineOutput(
                                piece.text,
                                tokens,
                                prompt_tokens,
                                logprobs=logprobs,
                                truncated_prompt_tokens=dropped,
                                cached_prompt_tokens=piece.cached,
                            )
                raise RuntimeError("llama.cpp ended the stream without a finish reason")
            finally:
                self._live.pop(key, None)

    def load_adapter(self, name: str, folder: str) -> None:
        """llama.cpp loads its adapters at start (`lora.adapters`): nothing to load, or a 400."""
        if name not in self.lora_ids:
            raise InvalidRequestError(
                f"The LoRA adapter {name!r} cannot be loaded: llama.cpp serves the adapters listed in lora.adapters "
                f"({', '.join(self.lora_ids) or 'none'}), loaded at start",
                param="model",
            )

    def with_adapter(self, body: dict[str, Any], adapter: str | None) -> dict[str, Any]:
        """The body with every adapter's scale (1 for the request's, 0 for the others: llama.cpp
        otherwise applies an adapter at its start scale); the prefix cache off, since a slot's
        cached prompt may have been computed with another adapter.
        """
        if not self.lora_ids:
            return body
        lora = [{"id": i, "scale": 1.0 if name == adapter else 0.0} for name, i in self.lora_ids.items()]
        return {**body, "lora": lora, "cache_prompt": False}

    def _stream(self, body: dict[str, Any], on_chunk: Callable[[dict[str, Any]], bool]) -> None:
        """Runs one streamed completion (blocking, on the pool's thread)."""
        self._server.stream(body, on_chunk)

    _read = staticmethod(read_chunk)  # a streamed chunk as our piece

    # ------------------------------------------------------------------ the prompt

    def _prepare(self, request: GenerateRequest) -> Prepared:
        """Token ids, limits and the completion body (blocking: tokenizing is an HTTP call)."""
        if request.images:
            raise InvalidRequestError("This model's llama.cpp engine takes no images.", param="messages")
        body = self.with_adapter(
            completion_body(request, self.params, self.vocab_size, self.max_model_len), request.adapter
        )
        limits = request_limits(self.max_model_len, request, self.params)
        if request.prompt is not None:
            ids = self.prompt_ids(request.prompt)
            return Prepared(len(ids), {**body, "prompt": ids, "n_predict": limits.completion(len(ids), "prompt")})
        ids, fitted = fit_rendered(
            request.messages,
            lambda chat: self.text_ids(
                self.render_chat(
                    chat,
                    request.tools,
                    add_generation_prompt=request.add_generation_prompt,
                    template_kwargs=request.chat_template_kwargs,
                )
            ),
            len,
            limits,
            self.params.context_overflow,
        )
        body = {**body, "prompt": ids, "n_predict": fitted.max_tokens}
        return Prepared(len(ids), body, fitted.dropped_prompt_tokens)


def _request_error(exc: BaseException) -> BaseException:
    """What a request raises for llama.cpp's error: a 400 for what it says is the request's fault
    (xllamacpp raises ValueError for llama.cpp's invalid arguments), else the error itself.
    """
    if isinstance(exc, LlamaCppError) and 400 <= exc.status < 500:
        return InvalidRequestError(f"llama.cpp: {exc}")
    if isinstance(exc, ValueError):
        return InvalidRequestError(f"llama.cpp: {exc}")
    if isinstance(exc, LlamaCppError) and exc.status == 503:
        return DecoderUnavailable(f"llama.cpp: {exc}")
    return exc
