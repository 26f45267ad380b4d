"""An engine's settings (``params:`` of a models.yaml entry, and the builder's overrides).

Those that every engine reads are `EVERY_ENGINE` (a request's defaults, its room, the batch's size);
each other setting belongs to the engines that read it, which their specs in the engine registry
(`engines/registry.py`, `EngineSpec.settings`) name: an entry that sets one that its engine does not
read is refused when the service is built, with the engine and the setting named.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    Field,
    model_validator,
)

from deployments.config.lora import LoraConfig
from deployments.config.strict import StrictModel


class EngineParams(StrictModel):
    """Engine settings of one model. Every field has a default."""

    dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        "auto",
        description="Weights dtype (transformers only: llama.cpp runs the GGUF file's own types and refuses it). "
        "auto: bfloat16 on a GPU that supports it, else float32.",
    )
    quantization: Literal["none", "bnb-4bit", "bnb-8bit", "int4-cpu"] = Field(
        "none",
        description="On-the-fly quantization after loading (transformers only: llama.cpp runs the GGUF file as "
        "it is and refuses it). bnb-4bit, bnb-8bit: bitsandbytes, CUDA only. "
        "int4-cpu: weight-only int4 in groups of 32 with bfloat16 activations (torch's CPU kernel), "
        "every linear layer but the output embedding, whose top logits are recomputed in float32; keeps a "
        "GGUF Q4 file's weights at 4 bits. On a GPU replica it does nothing (logged): use bnb-4bit there.",
    )
    device_ids: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=list,
        description="GPU indices among those Ray assigned to the replica (transformers only). Empty: all "
        "assigned GPUs (the model is sharded over them when there are several); CPU when there are none.",
    )
    batching: Literal["auto", "continuous", "static", "sequential"] = Field(
        "auto",
        description="transformers only (llama.cpp always batches continuously, and refuses it). continuous: one "
        "paged-attention batch per replica (transformers' manager) that requests join and leave at every step, each "
        "with its own sampling, seed and penalties. static: our own decoder for Llama, Qwen2, Qwen3 and Mistral "
        "shapes: a static KV cache of max_num_seqs slots (a request holds one; mem, when set, divides among them), "
        "prompts prefilled in chunks, decode steps padded to batch buckets (1, 2, 4, ... max_num_seqs) and each "
        "bucket captured in a CUDA graph at start on a GPU (torch.compile first with compile_level > 0), the same "
        "steps eagerly on a CPU; the same per-request sampling. sequential: one generate() per request; slower. "
        "auto: static on one CUDA GPU for a model of those shapes (not with bnb quantization), else continuous. "
        "Not yet measured on a GPU (docs/benchmarks.md).",
    )
    mem: int | None = Field(
        None,
        gt=0,
        description="KV-cache memory budget in MB (continuous batching and llama.cpp; on llama.cpp, a budget "
        "below max_num_seqs x max_model_len makes one KV pool the slots share). Default: room for max_num_seqs "
        "sequences of max_model_len tokens.",
    )
    max_num_seqs: int = Field(8, gt=0, description="Sequences decoded concurrently by one replica.")
    kv_cache_dtype: Literal["auto", "f16", "q8_0"] = Field(
        "auto",
        description="llama.cpp: the KV cells' type. auto: f16 (llama.cpp's own default, and its fastest prompt "
        "reading on the CPU), or q8_0 with `batch_invariant`. q8_0: about half f16's memory per token, prompts of "
        "thousands of tokens read 2.7-4x slower (docs/benchmarks.md, Long prompts). transformers: refused (its KV "
        "cache has the model's dtype).",
    )
    batch_invariant: bool = Field(
        False,
        description="llama.cpp: a greedy answer is the same whatever runs beside it (docs/reliability.md, Greedy "
        "answers and the batch): q8_0 KV cells, a stream per slot. It costs prompt-reading speed (2.7-4x at 2,000 "
        "to 6,600 prompt tokens on 2 cores). Refused with kv_cache_dtype f16, a `mem` below "
        "max_num_seqs x max_model_len (a shared pool) or `lora`, which cannot hold it. /health and the effective "
        "config say which is on.",
    )
    prefill_chunk_size: int | None = Field(
        None,
        gt=0,
        description="Most tokens per batching step (prompt chunks + decodes; llama.cpp's n_batch). Default: "
        "512 (transformers), llama.cpp's own 2048. llama.cpp: also the prompt tokens that may be in prefill at "
        "once; a prompt waits, first come first served, while those before it fill it (a prompt alone always enters).",
    )
    cuda_graphs: Literal["auto", "on", "off"] = Field(
        "auto",
        description="transformers continuous batching on a GPU: replay each step from a CUDA graph captured at "
        "padded batch shapes (the sampler then runs as fixed tensor ops). auto: on when attention needs no mask "
        "(flash-attention kernels, used when installed), off with sdpa, whose padded steps attend over the padded "
        "KV length (measured slower on an H200: docs/benchmarks.md); the padding intervals are passed only with on "
        "or compile_level > 0, since transformers reads any padding as a request for graphs. No effect on a CPU, on "
        "llama.cpp or on batching: static (which captures its own decode steps on a GPU).",
    )
    compile_level: int = Field(
        0,
        ge=0,
        le=3,
        description="transformers continuous batching: torch.compile the step (the library's default_compile_level: "
        "0 off, 1 to 3 more optimisation for a longer warm-up). Not yet measured on a GPU; 0 keeps start-up fast.",
    )
    graph_q_padding: int = Field(
        64,
        gt=0,
        description="With cuda_graphs: on or compile_level > 0 (else none): a step's query tokens are padded to a "
        "multiple of this, so that few shapes need a graph (the library's default).",
    )
    graph_kv_padding: int = Field(
        256,
        gt=0,
        description="With cuda_graphs: on or compile_level > 0 (else none): the KV tokens a step reads are padded "
        "to a multiple of this (one page). The library's default, 16,384, makes every step read and mask that many; "
        "a smaller value means more graphs, each over less padding. Not yet measured on a GPU.",
    )
    enable_prefix_caching: bool = Field(
        True,
        description="llama.cpp: a request whose prompt starts as one that a slot still holds reuses that "
        "prefix's KV cache (llama.cpp's cache_prompt, vLLM's enable_prefix_caching): the shared chat template "
        "and system prompt are computed once; usage.prompt_tokens_details.cached_tokens says how many were "
        "reused. A prefix computed in another batch shape can change the last bits of the logits, so a request "
        "with a seed is always computed whole: the same seed and request give the same answer whatever ran "
        "before or beside it. transformers: batching static keeps each slot's last prompt the same way (a "
        "request with a seed computed whole, as here); continuous batching shares the complete 256-token pages "
        "of finished prompts (transformers' block sharing, seeded requests too); sequential keeps nothing.",
    )
    cache_ram_mib: int = Field(
        1024,
        ge=0,
        description="llama.cpp: host memory (MiB) for prompts that left their slot (llama.cpp's prompt cache, "
        "--cache-ram): when more sessions than slots share a replica, a session's prefix evicted from its slot is "
        "copied back from here instead of read again. 0: none. 1024 holds about 24 prompts of 1,900 tokens of the "
        "default model (22.5 KiB of f16 KV cells a token); llama-server's own default is 8192. /health and the "
        "effective config say it. transformers: refused.",
    )
    cpu_threads: Annotated[int, Field(gt=0)] | Literal["all"] | None = Field(
        None,
        description="Compute threads on CPU (torch's, or llama.cpp's): a number, all (the cores; a decoder "
        "shares them among its CPU replicas), or null (transformers: Ray's num_cpus; llama.cpp: as all).",
    )
    cpu_threads_batch: Annotated[int, Field(gt=0)] | Literal["all"] | None = Field(
        None,
        description="llama.cpp: threads of batched steps (a prompt's chunks, several sequences decoded together; "
        "llama-server's -tb), where cpu_threads (-t) run the one-token steps of a lone sequence. A number, all "
        "(as for cpu_threads), or null: as cpu_threads. On 2 cores, one thread for one-token steps and both for "
        "batched ones measured no faster than both for all (docs/benchmarks.md, Threads by step kind, again).",
    )
    max_model_len: int | None = Field(
        None, gt=0, description="Context length (prompt + completion). Default: the model's own."
    )
    context_overflow: Literal["error", "truncate"] = Field(
        "error",
        description="A chat that does not fit max_model_len with its max_tokens (the request's, else the default). "
        "error: a 400 context_length_exceeded with the numbers (the default max_tokens is first cut to the "
        "context left). truncate: the oldest turns (a user message and the assistant and tool messages answering "
        "it) are dropped whole until it fits; system messages and the last user turn are always kept, and an "
        "image (its placeholder run or its caption) is never cut; usage.truncated_prompt_tokens says how many "
        "prompt tokens were dropped; a 400 when even those do not fit. A legacy completion's prompt is never cut.",
    )
    temperature: float = Field(0.7, ge=0, le=2, description="Default sampling temperature; 0 = greedy.")
    top_p: float = Field(1.0, gt=0, le=1, description="Default nucleus sampling mass.")
    top_k: int = Field(0, ge=0, description="Default top-k; 0 disables it.")
    min_p: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Default min-p (vLLM's): tokens less likely than min_p times the most likely one are left out; "
        "0 disables it.",
    )
    frequency_penalty: float = Field(0.0, ge=-2, le=2, description="Default OpenAI frequency penalty.")
    presence_penalty: float = Field(0.0, ge=-2, le=2, description="Default OpenAI presence penalty.")
    max_tokens: int = Field(256, gt=0, description="Default completion length when a request sets none.")
    mem_budget_mb: int | None = Field(
        None,
        gt=0,
        description="Native vision: the replica's memory budget, MB, checked at start against the peak of a "
        "worst-case batch (max_num_seqs requests, each with the model's image limit at the processor's largest "
        "size and text up to max_model_len): the peak RSS of the process on CPU, the CUDA allocator's peak on a "
        "GPU. Over it, the replica refuses to start. Default: none on CPU (measured and reported only); on a GPU "
        "the card's memory times the replica's GPU share.",
    )
    processor_cache_mb: float = Field(
        256.0,
        ge=0,
        description="Native vision: processed image tensors kept per replica, keyed by the image's SHA-256, "
        "bounded in MB (least recently used first out); 0 disables.",
    )
    batch_wait_ms: float = Field(
        10.0,
        ge=0,
        le=10_000,
        description="Native vision: how long an idle replica waits for more requests to fill a batch.",
    )
    stream_interval_ms: float = Field(
        0.0,
        ge=0,
        le=10_000,
        description="Coalesce streamed text: after a chunk, new text is held until this many ms have passed, "
        "then sent as one chunk (the first and the last are never held): fewer Serve messages per token. "
        "0 sends every piece.",
    )

    lora: LoraConfig | None = Field(
        None,
        description="LoRA adapters served on this model (docs/lora.md): transformers (PEFT folders; batching static "
        "or sequential, auto then picks static) and llama.cpp (GGUF adapter files, loaded at start). Requests name "
        "one as model '<base>:<adapter>' or by its own name.",
    )

    @model_validator(mode="after")
    def _int4_dtype(self) -> EngineParams:
        if self.quantization == "int4-cpu" and self.dtype not in {"auto", "bfloat16"}:
            raise ValueError(f"quantization int4-cpu computes in bfloat16; dtype {self.dtype} cannot be used with it")
        return self

    @model_validator(mode="after")
    def _invariant_cells(self) -> EngineParams:
        if self.batch_invariant and self.kv_cache_dtype == "f16":
            raise ValueError(
                "batch_invariant needs q8_0 KV cells (llama.cpp's attention takes f16 cells by kernels that depend on "
                "the batch's shape): set kv_cache_dtype auto or q8_0, or batch_invariant false"
            )
        if self.batch_invariant and self.lora is not None:
            raise ValueError(
                "batch_invariant cannot hold with lora: llama.cpp batches the requests of one adapter together and "
                "computes the adapter's products with kernels that follow how many rows share the step, so a greedy "
                "answer with an adapter can change with the load (docs/lora.md): set batch_invariant false, or serve "
                "the adapters from another entry"
            )
        return self


EVERY_ENGINE = frozenset(
    {
        "max_num_seqs",
        "mem",
        "prefill_chunk_size",
        "cpu_threads",
        "max_model_len",
        "context_overflow",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "frequency_penalty",
        "presence_penalty",
        "max_tokens",
        "stream_interval_ms",
    }
)
"""The settings of `EngineParams` that every engine reads; the others are engine-specific."""
