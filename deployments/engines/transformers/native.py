"""A transformers vision-language model (`AutoProcessor` + `AutoModelForImageTextToText`) as the
primary decoder (`vision_mode: native`): the chat's images go to the model itself.

A request's prompt is built off the event loop (`native_prompt`: the processor's chat template,
each image processed once per replica through the `ProcessorCache`, the placeholders expanded to
image tokens), checked against the context (text plus image tokens plus max_tokens), then waits
for a batch: the replica's `Batcher` forms one of up to `max_num_seqs` requests whenever the model
is free, and `native_batch.run_batch` decodes it, every request with its own sampling, length and
stream. At load, the worst-case batch is run once (`memory_profile`) and its peak checked against
the budget; the figure is in the engine-ready line and on /health.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from transformers import AutoModelForImageTextToText, AutoProcessor

from deployments.config import ImageInputConfig, ModelConfig
from deployments.engines.batcher import Batcher
from deployments.engines.bridge import ThreadStream
from deployments.engines.context import fit_rendered
from deployments.engines.extensions import refuse_unsupported
from deployments.engines.transformers.base import TransformersDecoder
from deployments.engines.transformers.chat_template import (
    marker_token_ids,
    raw_prompt_ids,
    resolve_tool_rendering,
)
from deployments.engines.transformers.constraints import build_constraints
from deployments.engines.transformers.memory_profile import (
    MemoryProfile,
    check_budget,
    default_budget_mb,
    largest_image,
    measure,
)
from deployments.engines.transformers.native_batch import Collected, NativeJob, run_batch
from deployments.engines.transformers.native_prompt import NativePrompt, NativePromptBuilder
from deployments.engines.transformers.processor_cache import ProcessorCache
from deployments.engines.transformers.sampling import Sampling
from deployments.engines.transformers.stream import TokenStream
from deployments.errors import DecoderUnavailable
from deployments.protocol.replica import GenerateRequest, TokenizeInput
from deployments.roles import Role

# vLLM's extensions its batch's row sampler and its chat rendering do not take (yet): 400s naming them.
NATIVE_UNSUPPORTED = (
    "repetition_penalty",
    "min_tokens",
    "ignore_eos",
    "chat_template_kwargs",
    "add_generation_prompt",
    "continue_final_message",
)


class NativeVisionEngine(TransformersDecoder):
    """A VLM as the primary decoder (`vision_mode: native`): images go into the model itself."""

    FRONT = ("processor", AutoProcessor)
    MODEL = AutoModelForImageTextToText

    def __init__(self, model: ModelConfig) -> None:
        super().__init__(Role.DECODER, model)
        self.processor = self.front
        limit = model.capabilities.max_images_per_request
        self.max_images = ImageInputConfig().max_images_per_request if limit is None else limit
        self.cache = ProcessorCache(int(self.params.processor_cache_mb * 2**20))
        tools = resolve_tool_rendering(self.processor, model.capabilities.tool_call_format, model.name)
        self.tool_format = tools.format
        self.tool_marker_ids = marker_token_ids(self.tokenizer, tools.format)
        self.prompts = NativePromptBuilder(self.processor, model.capabilities.image_token, self.cache, tools)
        self._batcher: Batcher[NativeJob, None] = Batcher(
            self._run_batch, self.params.max_num_seqs, self.params.batch_wait_ms / 1000
        )
        self.batches: list[int] = []  # sizes of the last batches, for /health and tests
        self.profile = self._profile_memory()
        check_budget(self.profile)
        self.progress.done(self.model)

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "engine": "native-vision",
            "max_images_per_request": self.max_images,
            "image_token": self.prompts.image_token,
            "tool_call_format": self.tool_format,
            "memory_profile_peak_mb": self.profile.peak_mb,
            "memory_budget_mb": self.profile.budget_mb,
            "memory_profile": self.profile.describe(),
        }

    def stats(self) -> dict[str, Any]:
        return {
            "last_batch_sizes": self.batches[-10:],
            "processor_cache": self.cache.describe(),
            "memory_profile": self.profile.describe(),
        }

    # ------------------------------------------------------------------ requests

    def prompt(self, request: GenerateRequest) -> NativePrompt:
        """The request's prompt: the chat with its images, or a legacy completion's text as it is."""
        if request.prompt is not None:
            return self.prompts.text(raw_prompt_ids(self.tokenizer, request.prompt, self.vocab_size))
        return self.prompts.chat(request.messages, request.images, request.tools)

    def prompt_ids(self, request: TokenizeInput) -> tuple[list[int], int]:
        """/tokenize: the prompt with each image's expansion (its processor's, cached as for a request)."""
        if request.prompt is not None:
            return list(self.tokenizer(request.prompt, add_special_tokens=request.special_tokens).input_ids), 0
        prompt = self.prompts.chat(
            request.messages,
            request.images,
            request.tools,
            add_generation_prompt=request.add_generation_prompt,
            continue_final_message=request.continue_final_message,
            add_special_tokens=request.special_tokens,
        )
        return prompt.ids, prompt.image_tokens

    def _job(self, request: GenerateRequest) -> NativeJob:
        """The request's prompt fitted to the context (`context.fit_context`: a 400 with the numbers,
        or under `context_overflow: truncate` its oldest turns dropped whole, with their images), and
        its settings.
        """
        limits = self.limits(request)
        if request.prompt is not None:
            prompt = self.prompt(request)
            max_tokens, dropped = limits.completion(len(prompt.ids), "prompt"), 0
        else:
            prompt, fitted = fit_rendered(
                request.messages,
                lambda chat: self.prompts.chat(chat, request.images, request.tools),
                lambda built: len(built.ids),
                limits,
                self.params.context_overflow,
                lambda built: f" ({built.image_tokens} of them image tokens)" if built.image_tokens else "",
            )
            max_tokens, dropped = fitted.max_tokens, fitted.dropped_prompt_tokens
        return NativeJob(
            prompt=prompt,
            max_tokens=max_tokens,
            dropped_prompt_tokens=dropped,
            sampling=self.sampling(request),
            penalties=self.penalties(request),
            seed=request.seed,
            constraints=build_constraints(request, self.vocab_size, self.grammars),
        )

    async def start(self, request: GenerateRequest) -> TokenStream:
        refuse_unsupported(request, NATIVE_UNSUPPORTED, "transformers, native vision")
        job = await asyncio.to_thread(self._job, request)

        async def tokens() -> AsyncIterator[list[int]]:
            stream = ThreadStream[int](_request_error)
            job.out, job.cancelled = stream, stream.cancelled  # a row still decoding ends at the next step
            submitted = asyncio.ensure_future(self._batcher.submit(job))
            try:
                with stream:
                    async for token in stream:
                        yield [token]
            finally:
                submitted.cancel()  # a job still waiting for its batch never joins one

        return TokenStream(tokens(), len(job.prompt.ids), job.max_tokens, job.constraints, job.dropped_prompt_tokens)

    async def _run_batch(self, jobs: list[NativeJob]) -> list[None]:
        self.batches = [*self.batches[-99:], len(jobs)]
        await asyncio.to_thread(run_batch, self.model, jobs, self.special, self.eos_ids)
        return [None] * len(jobs)

    # ------------------------------------------------------------------ load-time profile

    def _profile_memory(self) -> MemoryProfile:
        """Runs the worst-case batch once (prefill and one decode step) and records its peak."""
        image = self.prompts.process(largest_image())
        per_image = len(image.tokens)
        prompt_len = self.max_model_len - 2  # room for the decode step
        images = min(self.max_images, prompt_len // per_image) if per_image else 0
        filler = self.tokenizer(" a", add_special_tokens=False).input_ids[-1]
        ids = [filler] * (prompt_len - images * per_image) + [self.prompts.image_token_id] * images
        prompt = self.prompts.assemble(ids, [image] * images)
        out = Collected()
        jobs = [
            NativeJob(prompt=prompt, max_tokens=2, sampling=Sampling(0.0, 1.0, 0), out=out)
            for _ in range(self.params.max_num_seqs)
        ]
        peak, seconds = measure(self.device, lambda: run_batch(self.model, jobs, self.special, self.eos_ids))
        if out.errors:
            raise out.errors[0]
        budget = self.params.mem_budget_mb or default_budget_mb(self.device)
        measured = "cuda_max_allocated" if self.device.startswith("cuda") else "process_peak_rss"
        return MemoryProfile(peak, budget, measured, len(jobs), images, per_image, len(prompt.ids), round(seconds, 2))


def _request_error(exc: BaseException) -> BaseException:
    """What a request whose batch failed raises: out of memory is a 503 (retry later), the rest as it is."""
    if "OutOfMemory" in type(exc).__name__ or "out of memory" in str(exc).lower():
        return DecoderUnavailable(f"The decoder ran out of memory in this request's batch ({type(exc).__name__}).")
    return exc
