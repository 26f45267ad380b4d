"""One served model's answering, which every API's service formats (`AnswerCore`): its decoder,
the request's deadline (`server.request_timeout_s`: a 408 before the first byte, an error event
after; the generation is cancelled either way), the sampling settings as the decoder takes them,
the vision pipeline, and the opening of an answer, written once for every API (`open`: the deadline,
the chat through the vision pipeline, the decoder request with the tool plan's tools, and the start
of the generation, whose first chunk is awaited before anything is sent, so that errors before the
first byte keep their status); and the decoder's tokenizer (`tokenize`, `detokenize`), which needs
no generation.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from deployments.errors import InvalidRequestError, RequestTimeoutError
from deployments.ingress.answer.stream import DecoderStream, Generation, TokenCounts
from deployments.ingress.handles import DecoderHandle
from deployments.ingress.vision.pipeline import DecoderInput, Degraded, VisionPipeline
from deployments.monitoring.access_log import RequestRecord
from deployments.protocol.openai.chat import ChatMessage
from deployments.protocol.openai.common import SamplingFields, StructuredOutputs
from deployments.protocol.replica import (
    BACKGROUND_PRIORITY,
    GenerateRequest,
    GrammarSpec,
    TokenizedPrompt,
    TokenizeInput,
)
from deployments.tools.plan import ToolPlan


class Deadline:
    """A request's deadline, from now, on the event loop's clock."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.at = asyncio.get_running_loop().time() + timeout_s

    def error(self) -> RequestTimeoutError:
        return RequestTimeoutError(
            f"The request did not finish within {self.timeout_s:g} s (server.request_timeout_s); "
            "its generation was cancelled."
        )

    @asynccontextmanager
    async def within(self) -> AsyncIterator[None]:
        """Run the block before the deadline; past it, the block is cancelled and `error()` raised."""
        timeout = asyncio.timeout_at(self.at)
        try:
            async with timeout:
                yield
        except TimeoutError:
            if timeout.expired():
                raise self.error() from None
            raise


def sampling_fields(body: SamplingFields, max_n: int) -> dict[str, Any]:
    """`GenerateRequest` fields of the request's sampling settings; `n` beyond `max_n` and
    `logit_bias` keys that are not token ids are 400s.
    """
    if body.n > max_n:
        raise InvalidRequestError(f"n is {body.n}; this server allows at most {max_n} (server.max_n).", param="n")
    return {
        "temperature": body.temperature,
        "top_p": body.top_p,
        "top_k": body.top_k,
        "min_p": body.min_p,
        "frequency_penalty": body.frequency_penalty,
        "presence_penalty": body.presence_penalty,
        "stop": body.stop_sequences,
        "seed": body.seed,
        "n": body.n,
        "logit_bias": _token_bias(body.logit_bias),
        "repetition_penalty": body.repetition_penalty,
        "min_tokens": body.min_tokens,
        "ignore_eos": body.ignore_eos,
        "stop_token_ids": body.stop_token_ids or [],
        "skip_special_tokens": body.skip_special_tokens,
        "include_stop_str_in_output": body.include_stop_str_in_output,
        "priority": body.priority,
    }


def structured_grammar(outputs: StructuredOutputs | None) -> GrammarSpec | None:
    """The grammar of vLLM's `structured_outputs` (None when the request has none)."""
    if outputs is None:
        return None
    param = "structured_outputs"
    if outputs.json_object:
        return GrammarSpec(kind="json_object", param=param)
    if outputs.json_ is not None:
        schema = outputs.json_ if isinstance(outputs.json_, str) else json.dumps(outputs.json_)
        return GrammarSpec(kind="json_schema", json_schema=schema, param=param)
    if outputs.regex is not None:
        return GrammarSpec(kind="regex", pattern=outputs.regex, param=param)
    if outputs.choice is not None:
        return GrammarSpec(kind="choice", choices=outputs.choice, param=param)
    return GrammarSpec(kind="grammar", pattern=outputs.grammar, param=param)


def _token_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    if not bias:
        return None
    try:
        return {int(token): value for token, value in bias.items()}
    except ValueError:
        raise InvalidRequestError(
            "logit_bias keys must be token ids (integers, as strings).", param="logit_bias"
        ) from None


@dataclass(frozen=True)
class Opened:
    """An answer begun: its generation (the first chunk in hand) and what the vision pipeline could
    not show the decoder (None: every image seen).
    """

    generation: Generation
    degraded: Degraded | None

    @property
    def headers(self) -> dict[str, str]:
        """The reply's headers that say the answer is degraded (`X-Vision-Degraded`)."""
        return self.degraded.headers if self.degraded else {}

    @property
    def notice(self) -> str | None:
        """The degraded-vision notice to put before the answer's text."""
        return self.degraded.notice if self.degraded else None


class AnswerCore:
    """A plain class over the decoder's handle (or a fake with the same calls), so that every
    endpoint's service runs, and is tested, without Ray and without HTTP.
    """

    def __init__(
        self,
        decoder: DecoderHandle,
        vision: VisionPipeline,
        *,
        model_name: str,
        request_timeout_s: float,
        max_n: int = 8,
    ) -> None:
        """`vision`: how the model takes a request's images; `max_n`: the most choices a request may
        ask for.
        """
        self._decoder = decoder
        self.vision = vision
        self.model = model_name
        self._timeout_s = request_timeout_s
        self._max_n = max_n

    def deadline(self) -> Deadline:
        """The deadline of a request that starts now."""
        return Deadline(self._timeout_s)

    def sampling(self, body: SamplingFields) -> dict[str, Any]:
        return sampling_fields(body, self._max_n)

    async def prepare(self, messages: list[ChatMessage], record: RequestRecord) -> tuple[Deadline, DecoderInput]:
        """A request's deadline, from now, and its chat through the vision pipeline before it."""
        deadline = self.deadline()
        async with deadline.within():
            seen = await self.vision.prepare(messages, record)
        return deadline, seen

    async def open(self, messages: list[ChatMessage], plan: ToolPlan, record: RequestRecord, **settings: Any) -> Opened:
        """The opening of every API's answer to a chat: the chat through the vision pipeline, the
        decoder's request (the plan's tools and the request's generation `settings`, a grammar among
        them), and its generation started, all before the request's deadline.
        """
        deadline, seen = await self.prepare(messages, record)
        request = GenerateRequest(messages=seen.messages, images=seen.images, tools=plan.tools, **settings)
        return Opened(await self.generate([request], deadline, record), seen.degraded)

    async def generate(self, requests: list[GenerateRequest], deadline: Deadline, record: RequestRecord) -> Generation:
        """One decoder call per request (all of the same `n`), read as one answer; `record` gets the
        time of the first chunk and the token counts of them all (every prompt, every sequence). A
        batch line's requests (`record.batch`) are background work: `BACKGROUND_PRIORITY`, or the
        later priority the line asked for; a keyed request (`record.tenant`) queues as its key's, at
        no earlier a priority than the key's.
        """
        if record.batch is not None:
            requests = [r.model_copy(update={"priority": max(r.priority, BACKGROUND_PRIORITY)}) for r in requests]
        if record.tenant is not None:  # the key's place in the decoders' queue: its priority at the earliest
            tenant = record.tenant
            requests = [
                r.model_copy(
                    update={
                        "priority": max(r.priority, tenant.priority),
                        "tenant": tenant.queue,
                        "tenant_share": tenant.share,
                    }
                )
                for r in requests
            ]
        counts = TokenCounts(record)  # every call's tokens, summed: what the limits settle
        streams = [
            DecoderStream(
                self._streaming(record).generate.remote(request),
                deadline.at,
                deadline.error,
                record,
                counts,
                call,
            )
            for call, request in enumerate(requests)
        ]
        return await Generation.start(streams, requests[0].n)

    def _streaming(self, record: RequestRecord) -> DecoderHandle:
        """The decoder's streaming handle; the client's session hint (`record.session`) reaches its
        router (`routing.router`) as Serve's session id.
        """
        if record.session:
            return self._decoder.options(stream=True, session_id=record.session)
        return self._decoder.options(stream=True)

    async def tokenize(self, request: TokenizeInput, deadline: Deadline) -> TokenizedPrompt:
        """The decoder's tokens of a prompt (its engine's tokenizer and chat template), before the deadline."""
        async with deadline.within():
            answer: TokenizedPrompt = await self._decoder.tokenize.remote(request)
        return answer

    async def detokenize(self, tokens: list[int], deadline: Deadline) -> str:
        """The decoder's text of token ids, before the deadline."""
        async with deadline.within():
            text: str = await self._decoder.detokenize.remote(tokens)
        return text
