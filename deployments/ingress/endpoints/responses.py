"""The Responses endpoint's request logic (/v1/responses), apart from its routes: the request's
input (after the conversation of the response it continues, `previous_response_id`) becomes a chat
(`responses.items`), its images what the decoder gets (`vision.pipeline`), its tools a plan
(`tools.plan`), and the answer core's chunks the `response` object or its semantic events
(`responses.output`). With `store` (the default), the finished response is kept in the store that
every ingress replica reaches (`responses.store`) before its last event or its body is sent, so a
client can continue it at once; a failed response is not kept.

A request answered without some of its images says so as chat does: the `vision` field and
`system_fingerprint` on the response, the `X-Vision-Degraded` header, the notice before the text."""

from __future__ import annotations

import secrets
from typing import Any

from deployments.ingress.answer.core import AnswerCore
from deployments.ingress.answer.reply import Framing, Reply, streamed, whole
from deployments.ingress.responses.items import Item, as_input, chat_messages, stored_item, text_grammar, tool_plan
from deployments.ingress.responses.output import ResponseEvents, ResponseOutput
from deployments.ingress.responses.store import Entry, ResponseStorePort, earlier_entry
from deployments.ingress.vision.pipeline import Degraded
from deployments.monitoring.access_log import RequestRecord
from deployments.protocol.openai.common import DEGRADED_FINGERPRINT, Usage
from deployments.protocol.openai.responses import Response, ResponseRequest
from deployments.protocol.replica import GenerateRequest


class ResponseService:
    def __init__(self, core: AnswerCore) -> None:
        self._core = core

    async def create(self, body: ResponseRequest, record: RequestRecord, store: ResponseStorePort | None) -> Reply:
        """`record`: what this request's access-log line and metrics say; `store`: the responses kept
        (None: none are)."""
        core = self._core
        conversation: list[dict[str, Any]] = []
        if body.previous_response_id is not None:
            earlier = await earlier_entry(store, body.previous_response_id)
            conversation = earlier["conversation"] + [as_input(item) for item in earlier["response"]["output"]]
        plan = tool_plan(body)
        deadline = core.deadline()
        async with deadline.within():
            seen = await core.vision.prepare(chat_messages(body, _items(conversation)), record)
        request = GenerateRequest(
            messages=seen.messages,
            images=seen.images,
            tools=plan.tools,
            max_tokens=body.max_output_tokens,
            grammar=text_grammar(body, plan),
            temperature=body.temperature,
            top_p=body.top_p,
        )
        generation = await core.generate([request], deadline, record)
        degraded = seen.degraded
        output = ResponseOutput(plan, degraded.notice if degraded else None)
        base = echoed(body, f"resp_{secrets.token_hex(12)}", core.model, degraded)
        kept = _Keeper(store if body.store else None, body, conversation)
        headers = degraded.headers if degraded else {}
        if body.stream:
            events = ResponseEvents(base, output)

            async def end(usage: Usage) -> str:
                return events.end(await kept(output.response(base)))

            framing = Framing(error=events.error, end=None)
            return Reply(headers, events=streamed(generation, output.tally, events.feed, record, end, framing))
        await whole(generation, output.tally, output.feed)
        return Reply(headers, body=(await kept(output.response(base))).model_dump())


def _items(conversation: list[dict[str, Any]]) -> list[Item]:
    """Stored items as the request's models (they were validated when they came)."""
    parsed = ResponseRequest.model_validate({"model": "-", "input": conversation}) if conversation else None
    return parsed.items if parsed is not None else []


class _Keeper:
    """Keeps a finished response in the store (when there is one and `store` is true), with the
    request's input items and the conversation before them."""

    def __init__(self, store: ResponseStorePort | None, body: ResponseRequest, conversation: list[dict[str, Any]]):
        self._store = store
        self._input = [stored_item(item) for item in body.items]
        self._conversation = conversation

    async def __call__(self, response: Response) -> Response:
        if self._store is not None:
            entry: Entry = {
                "response": response.model_dump(),
                "input": self._input,
                "conversation": self._conversation + self._input,
            }
            await self._store.put(response.id, entry)
        return response


def echoed(body: ResponseRequest, response_id: str, model: str, degraded: Degraded | None) -> Response:
    """The response before its output: the request's fields that it echoes, and the degraded report."""
    choice = body.tool_choice
    return Response(
        id=response_id,
        model=model,
        instructions=body.instructions,
        metadata=body.metadata or {},
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        max_output_tokens=body.max_output_tokens,
        safety_identifier=body.safety_identifier,
        prompt_cache_key=body.prompt_cache_key,
        tools=[tool.model_dump() for tool in body.tools or []],
        tool_choice=choice.model_dump() if choice is not None and not isinstance(choice, str) else (choice or "auto"),
        parallel_tool_calls=body.parallel_tool_calls,
        text=body.text.model_dump() if body.text is not None else {"format": {"type": "text"}},
        store=body.store,
        previous_response_id=body.previous_response_id,
        user=body.user,
        system_fingerprint=DEGRADED_FINGERPRINT if degraded else None,
        vision=degraded.report if degraded else None,
    )
