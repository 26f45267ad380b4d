"""The legacy `/v1/completions` endpoint's request logic: a prompt used as it is (text or token
ids, no chat template), over the same answer core as chat (decoder, limits, deadline and errors).

A list of prompts is one decoder call per prompt, run together; choice `i * n + j` is prompt i's
j-th sequence, as OpenAI numbers them. `echo` puts the prompt before each choice's text (a text
prompt only: the ingress has no tokenizer). `logprobs` is OpenAI's legacy shape: parallel lists of
tokens, their logprobs, the top alternatives as a dict, and each token's offset in the text.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from deployments.errors import InvalidRequestError
from deployments.ingress.answer.core import AnswerCore, structured_grammar
from deployments.ingress.answer.events import Answer, Ended, Logprobs, Text
from deployments.ingress.answer.reply import Reply, sse, streamed, whole
from deployments.monitoring.access_log import RequestRecord
from deployments.protocol.openai.common import TokenLogprob, Usage
from deployments.protocol.openai.completions import (
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
)
from deployments.protocol.replica import GenerateChunk, GenerateRequest


class CompletionService:
    """The request logic of the legacy /v1/completions for one served model."""

    def __init__(self, core: AnswerCore) -> None:
        self._core = core

    async def create(self, body: CompletionRequest, record: RequestRecord) -> Reply:
        core = self._core
        prompts = body.prompts
        if body.echo and not all(isinstance(p, str) for p in prompts):
            raise InvalidRequestError("echo needs a text prompt (token ids cannot be echoed here).", param="echo")
        settings = core.sampling(body)
        requests = [
            GenerateRequest(
                prompt=prompt,
                max_tokens=body.max_tokens,
                logprobs=body.logprobs,
                grammar=structured_grammar(body.structured_outputs),
                **settings,
            )
            for prompt in prompts
        ]
        generation = await core.generate(requests, core.deadline(), record)
        echoes = [p if body.echo and isinstance(p, str) else "" for p in prompts for _ in range(body.n)]
        answer = Answer(len(echoes), None, per_prompt=body.n)
        writer = _Writer(f"cmpl-{record.request_id}", core.model, echoes, answer, body.logprobs is not None)
        if body.stream:
            usage = writer.usage_event if body.include_usage else None
            return Reply(events=streamed(generation, answer.tally, writer.events, record, usage))
        await whole(generation, answer.tally, writer.piece)
        return Reply(body=writer.completion())


def _legacy_logprobs(tokens: list[TokenLogprob], offset: int) -> CompletionLogprobs:
    out = CompletionLogprobs()
    for token in tokens:
        out.tokens.append(token.token)
        out.token_logprobs.append(token.logprob)
        out.top_logprobs.append({alt.token: alt.logprob for alt in token.top_logprobs})
        out.text_offset.append(offset)
        offset += len(token.token)
    return out


@dataclass
class _Choice:
    text: list[str] = field(default_factory=list)
    offset: int = 0  # characters of text so far (text_offset of the next token)
    logprobs: CompletionLogprobs = field(default_factory=CompletionLogprobs)


class _Writer:
    """A completion's choices from the answer's chunks: whole, or as server-sent events."""

    def __init__(self, cid: str, model: str, echoes: list[str], answer: Answer, logprobs: bool) -> None:
        """`echoes`: per choice, the text before its output."""
        self.cid, self.model, self.created = cid, model, int(time.time())
        self._echoes = echoes
        self._logprobs = logprobs
        self._choices = [_Choice() for _ in echoes]
        self._answer = answer

    def piece(self, chunk: GenerateChunk) -> CompletionChoice:
        """The choice's text, logprobs and finish in one chunk's events (the echo before its first
        text); the answer has no tool plan, so each chunk is one `Text`.
        """
        index, events = chunk.index, self._answer.feed(chunk)
        tokens = [token for event in events if isinstance(event, Logprobs) for token in event.tokens]
        text = "".join(event.text for event in events if isinstance(event, Text))
        finish = next((event.finish for event in events if isinstance(event, Ended)), None)
        choice = self._choices[index]
        start = choice.offset  # where this chunk's tokens begin in the text
        if not choice.text and self._echoes[index]:
            text = self._echoes[index] + text
            start = len(self._echoes[index])
        logprobs = _legacy_logprobs(tokens, start) if self._logprobs else None
        choice.text.append(text)
        choice.offset += len(text)
        if logprobs is not None:
            for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                getattr(choice.logprobs, name).extend(getattr(logprobs, name))
        return CompletionChoice(index=index, text=text, logprobs=logprobs, finish_reason=finish)

    def completion(self) -> dict:
        choices = [
            CompletionChoice(
                index=index,
                text="".join(choice.text),
                logprobs=choice.logprobs if self._logprobs else None,
                finish_reason=self._answer.tally[index].finish,
            )
            for index, choice in enumerate(self._choices)
        ]
        return Completion(
            id=self.cid, created=self.created, model=self.model, choices=choices, usage=self._answer.tally.usage()
        ).model_dump()

    def events(self, chunk: GenerateChunk) -> list[str]:
        """A chunk's piece of its choice, as an event."""
        return [self.event([self.piece(chunk)])]

    def usage_event(self, usage: Usage) -> str:
        return self.event([], usage=usage)

    def event(self, choices: list[CompletionChoice], usage: Usage | None = None) -> str:
        chunk = Completion(id=self.cid, created=self.created, model=self.model, choices=choices, usage=usage)
        return sse(chunk.model_dump())
