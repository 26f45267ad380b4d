"""llama.cpp's server, in this process (xllamacpp): how it is started, and the ways in.

- `stream(body, on_chunk)`: a completion request, blocking its thread until the stream ends; each
  streamed chunk (a dict in llama.cpp's OpenAI completion form) goes to `on_chunk`, and
  `on_chunk` returning True ends the stream: llama.cpp cancels the task and frees its slot.
- `stream_native(body, on_chunk)`: the same through llama.cpp's own ``/completion`` route (its native
  chunks), over the local HTTP listener. With a projector loaded (`mmproj_path`), this is the only
  way to send images: xllamacpp binds only the OpenAI completion route, which then takes a text
  prompt alone (no token ids, no ``multimodal_data``); ``/completion`` takes token ids and
  ``{"prompt_string": ..., "multimodal_data": [base64, ...]}``. Each such stream holds one of the
  server's HTTP threads (`http_streams` more are started); closing the connection (`on_chunk`
  returning True) cancels the task as the in-process stream does.
- `embeddings(body)`: an OpenAI embeddings request, in embedding mode (`ServerSettings.pooling`).
- `call(path, body)`: one of its HTTP routes (``/apply-template``, ``/tokenize``, ``/props``).
  xllamacpp has no binding for the chat template or the tokenizer, but the server always listens
  on 127.0.0.1 (a random port); a random API key, known only to this process, keeps other local
  processes off every route but ``/health`` and ``/models``. These routes are answered on the
  server's HTTP threads from the vocabulary and template alone, never waiting for a decode step.

Settings that differ from llama.cpp's defaults: a host-memory prompt cache of `cache_ram_mib`
(`ServerSettings.cache_ram_mib`, the model's `params.cache_ram_mib`; llama.cpp's own default is
8 GiB), no context shift (a
sequence never silently loses its beginning: the engine checks the context before it starts), no
web UI, two HTTP threads, and only errors in its log (its per-request lines would flood the
replica's log).
"""

from __future__ import annotations

import json
import secrets
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from deployments.engines.llamacpp.params import LlamaCppError

HTTP_THREADS = 2
LOG_ERRORS_ONLY = 1  # llama.cpp's verbosity: 0 output, 1 errors, 2 warnings, 3 info


@dataclass(frozen=True)
class ServerSettings:
    """What the engine decides: the GGUF file, the slots and the KV cache, the threads."""

    model_path: str
    n_parallel: int
    n_ctx: int  # KV-cache cells in all: n_parallel streams of n_ctx / n_parallel, or one shared pool
    kv_unified: bool
    threads: int  # one-token steps (llama-server's -t)
    threads_batch: int | None = None  # batched steps: prompt chunks, several sequences (-tb); None: `threads`
    n_batch: int | None = None  # most tokens per decode step (prompt chunks + one per running slot)
    mmproj_path: str | None = None  # a vision model's projector (llama.cpp's mtmd): images in prompts
    http_streams: int = 0  # streams read over HTTP at once (`stream_native`), beside the route calls
    pooling: str | None = None  # an embedding model's pooling (mean, cls, last): llama.cpp's embedding mode
    n_ubatch: int | None = None  # most tokens per compute pass (an embedding input must fit in one)
    kv_cache_type: Literal["f16", "q8_0"] = "f16"  # the K and V cells' type
    flash_attn: bool | None = None  # None: llama.cpp's auto (on where the CPU backend has it: always)
    lora_paths: tuple[str, ...] = ()  # GGUF LoRA adapters, loaded at start at scale 0: a request's `lora` picks
    cache_ram_mib: int = 0  # host memory for prompts that left their slot (llama.cpp's prompt cache); 0: none


class LlamaServer:
    """One llama.cpp server in this process, started from its `ServerSettings` (see the module's docstring)."""

    def __init__(self, settings: ServerSettings) -> None:
        import xllamacpp

        params = xllamacpp.CommonParams()
        params.model.path = settings.model_path
        params.n_parallel = settings.n_parallel
        params.n_ctx = settings.n_ctx
        params.kv_unified = settings.kv_unified
        params.cpuparams.n_threads = settings.threads
        params.cpuparams_batch.n_threads = settings.threads_batch or settings.threads
        if settings.n_batch is not None:
            params.n_batch = settings.n_batch
            params.n_ubatch = min(params.n_ubatch, settings.n_batch)
        if settings.pooling is not None:
            params.embedding = True
            params.pooling_type = getattr(
                xllamacpp.llama_pooling_type, f"LLAMA_POOLING_TYPE_{settings.pooling.upper()}"
            )
        if settings.n_ubatch is not None:
            params.n_ubatch = settings.n_ubatch
        kv_type = getattr(xllamacpp.ggml_type, f"GGML_TYPE_{settings.kv_cache_type.upper()}")
        params.cache_type_k = kv_type
        params.cache_type_v = kv_type
        if settings.flash_attn is not None:
            kind = "ENABLED" if settings.flash_attn else "DISABLED"
            params.flash_attn_type = getattr(xllamacpp.llama_flash_attn_type, f"LLAMA_FLASH_ATTN_TYPE_{kind}")
        params.cache_ram_mib = settings.cache_ram_mib
        params.ctx_shift = False
        params.ui = False
        if settings.mmproj_path is not None:
            params.mmproj.path = settings.mmproj_path
        if settings.lora_paths:  # each request names every adapter's scale (`lora` in its body)
            params.lora_adapters = [xllamacpp.CommonAdapterLoraInfo(path, 0.0) for path in settings.lora_paths]
            params.lora_init_without_apply = True
        params.n_threads_http = HTTP_THREADS + settings.http_streams
        params.verbosity = LOG_ERRORS_ONLY
        self._key = secrets.token_urlsafe(24)
        params.api_keys = [self._key]
        self._server: Any = xllamacpp.Server(params)
        self._base = str(self._server.listening_address)
        # The address is local: never through a proxy named in the environment.
        self._http = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        # `Server()` returns before its loop thread enters llama.cpp's task loop, and that loop marks
        # itself running when it starts: a close (the server's `terminate`) in between is lost, and
        # the destructor then waits for the loop forever. A /slots answer comes from the loop itself.
        self.call("/slots", timeout_s=120)

    def stream(self, body: dict[str, Any], on_chunk: Callable[[dict[str, Any]], bool]) -> None:
        """Runs a streamed completion request to its end (blocking); see the module's docstring."""
        server = self._server
        if server is None:
            raise LlamaCppError("the llama.cpp server was closed", 503)
        server.handle_completions(body, on_chunk)

    def embeddings(self, body: dict[str, Any]) -> dict[str, Any]:
        """An OpenAI embeddings request in llama.cpp's embedding mode (blocking): its answer, or
        `LlamaCppError` with llama.cpp's message and status.
        """
        server = self._server
        if server is None:
            raise LlamaCppError("the llama.cpp server was closed", 503)
        answer: dict[str, Any] = server.handle_embeddings(body)
        if "error" in answer:
            error = answer["error"] if isinstance(answer["error"], dict) else {"message": answer["error"]}
            raise LlamaCppError(str(error.get("message", error)), int(error.get("code", 500)))
        return answer

    def stream_native(self, body: dict[str, Any], on_chunk: Callable[[dict[str, Any]], bool]) -> None:
        """A streamed ``/completion`` request to its end (blocking); see the module's docstring. An
        error before the stream starts raises `LlamaCppError` with llama.cpp's status; one inside it
        is a chunk ``{"error": {...}}``, as in `stream`.
        """
        server = self._server  # held until the stream ends, as `stream` holds it
        if server is None:
            raise LlamaCppError("the llama.cpp server was closed", 503)
        request = self._request("/completion", body)
        try:
            response = self._http.open(request)  # no timeout: a queued request waits for a free slot
        except urllib.error.HTTPError as exc:
            raise LlamaCppError(_error_message(exc.read()), exc.code) from None
        with response:  # leaving it closes the connection: llama.cpp then cancels the task
            for line in response:
                if line.startswith(b"data: ") and on_chunk(json.loads(line[6:])):
                    return

    def call(self, path: str, body: dict[str, Any] | None = None, timeout_s: float = 30.0) -> Any:
        """One HTTP route of the server (GET without a body, else POST); `LlamaCppError` with its
        message and status when it answers with an error.
        """
        try:
            with self._http.open(self._request(path, body), timeout=timeout_s) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise LlamaCppError(_error_message(exc.read()), exc.code) from None

    def _request(self, path: str, body: dict[str, Any] | None) -> urllib.request.Request:
        """A request to one of the server's routes: GET without a body, else POST."""
        return urllib.request.Request(
            self._base + path,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self._key}"},
        )

    def close(self) -> None:
        """Stops llama.cpp's loop and frees the model and the KV cache (once streams still running,
        which hold the server, have ended).
        """
        self._server = None


def _error_message(body: bytes) -> str:
    try:
        error = json.loads(body).get("error", {})
        return str(error.get("message", error))
    except (ValueError, AttributeError):
        return body.decode(errors="replace")[:500]
