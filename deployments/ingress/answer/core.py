"""One served model's answering, which every endpoint's service frames (`AnswerCore`): its decoder,
the request's deadline (`server.request_timeout_s`: a 408 before the first byte, an error event
after; the generation is cancelled either way), the sampling settings as the decoder takes them,
the vision pipeline, and the start of a generation, whose first chunk is awaited before anything
is sent, so that errors before the first byte keep their status; and the decoder's tokenizer
(`tokenize`, `detokenize`), which needs no generation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from deployments.errors import InvalidRequestError, RequestTimeoutError
from deployments.ingress.answer.stream import DecoderStream, Generation
from deployments.ingress.ports import DecoderHandle
from deployments.ingress.vision.pipeline import VisionPipeline
from deployments.monitoring.access_log import RequestRecord
from deployments.protocol.openai.common import SamplingFields
from deployments.protocol.replica import GenerateRequest, TokenizedPrompt, TokenizeInput


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
    `logit_bias` keys that are not token ids are 400s."""
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
    }


def _token_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    if not bias:
        return None
    try:
        return {int(token): value for token, value in bias.items()}
    except ValueError:
        raise InvalidRequestError(
            "logit_bias keys must be token ids (integers, as strings).", param="logit_bias"
        ) from None


class AnswerCore:
    """A plain class over the decoder's handle (or a fake with the same calls), so that every
    endpoint's service runs, and is tested, without Ray and without HTTP."""

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
        ask for."""
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

    async def generate(self, requests: list[GenerateRequest], deadline: Deadline, record: RequestRecord) -> Generation:
        """One decoder call per request (all of the same `n`), read as one answer; `record` gets the
        time of the first chunk and the token counts."""
        streams = [
            DecoderStream(
                self._decoder.options(stream=True).generate.remote(request), deadline.at, deadline.error, record
            )
            for request in requests
        ]
        return await Generation.start(streams, requests[0].n)

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
