"""The Responses endpoint's request logic (/v1/responses), apart from its routes: the request's
input (after the conversation of the response it continues, `previous_response_id`) becomes a chat
(`responses.items`), its images what the decoder gets (`vision.pipeline`), its tools a plan
(`tools.plan`), and the answer core's chunks the `response` object or its semantic events
(`responses.output`). With `store` (the default), the finished response is kept in the store that
every ingress replica reaches (`responses.store`) before its last event or its body is sent, so a
client can continue it at once; a failed response is not kept.

A request answered without some of its images says so as chat does: the `vision` field and
`system_fingerprint` on the response, the `X-Vision-Degraded` header, the notice before the text.

Hosted tools (`web_search` and the like) are set aside: not offered to the model, named in the
reply's `X-Tools-Set-Aside` header (and in a WebSocket turn's access-log line, as in every
request's: `set_aside`).

A turn of the WebSocket mode (`responses.socket`) is a streamed create on its `ConnectionCache`: its
events are WebSocket messages, it continues the connection's last response first, and its own
response is remembered there, `store` or not. `compact` is /v1/responses/compact: the summary that
the model writes of the conversation (`responses.compaction`).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any

from deployments.errors import InvalidRequestError, ObjectNotFoundError
from deployments.ingress.answer.core import AnswerCore
from deployments.ingress.answer.events import Answer, Text
from deployments.ingress.answer.reply import Framing, Reply, named_sse, streamed, whole
from deployments.ingress.apis.responses.compaction import compacted_output, summary_request
from deployments.ingress.apis.responses.items import (
    Item,
    Namespaces,
    as_input,
    chat_messages,
    continued,
    stored_item,
    text_grammar,
    tool_plan,
)
from deployments.ingress.apis.responses.output import ResponseEvents, ResponseOutput, response_usage, socket_frame
from deployments.ingress.apis.responses.store import (
    ConnectionCache,
    ConversationPort,
    ResponseStorePort,
    earlier_entry,
)
from deployments.ingress.vision.pipeline import Degraded
from deployments.monitoring.access_log import RequestRecord
from deployments.protocol.openai.common import DEGRADED_FINGERPRINT, Usage
from deployments.protocol.openai.items import item_id
from deployments.protocol.openai.response_object import CompactedResponse, CompactRequest, Response
from deployments.protocol.openai.responses import ResponseRequest
from deployments.protocol.replica import GenerateChunk
from deployments.state.owners import Caller
from deployments.state.responses import Entry

logger = logging.getLogger("ray.serve")

# The reply's header that names the hosted tools set aside (not offered to the model), by type.
SET_ASIDE_HEADER = "X-Tools-Set-Aside"


class ResponseService:
    """The request logic of /v1/responses for one served model (see the module's docstring)."""

    def __init__(self, core: AnswerCore) -> None:
        self._core = core

    async def create(
        self,
        body: ResponseRequest,
        record: RequestRecord,
        store: ResponseStorePort | None,
        caller: Caller,
        connection: ConnectionCache | None = None,
        conversations: ConversationPort | None = None,
    ) -> Reply:
        """`record`: what this request's access-log line and metrics say; `store`: the responses kept
        (None: none are); `caller`: who asks (a response or conversation continued must be theirs, the
        response is kept as theirs); `connection`: the WebSocket connection's cache, for a turn of that
        mode; `conversations`: the conversations a turn may belong to (None: none are served).
        """
        core = self._core
        thread = _Thread(conversations, body.conversation_id, caller)
        if body.conversation_id and record.session is None:  # the decoders' router keeps it on one replica
            record.session = f"conversation:{body.conversation_id}"
        conversation = await thread.history() or await _conversation(
            store, body.previous_response_id, caller, connection
        )
        set_aside = body.set_aside
        record.set_aside = ",".join(set_aside) or None
        plan = tool_plan(body)
        settings = {"max_tokens": body.max_output_tokens, "temperature": body.temperature, "top_p": body.top_p}
        opened = await core.open(
            chat_messages(body, _items(conversation)), plan, record, grammar=text_grammar(body, plan), **settings
        )
        answer = Answer(1, plan, opened.notice)
        output = ResponseOutput(answer, Namespaces(body))
        headers = {**opened.headers, **({SET_ASIDE_HEADER: ", ".join(set_aside)} if set_aside else {})}
        base = echoed(body, f"resp_{secrets.token_hex(12)}", core.model, opened.degraded)
        kept = _Keeper(store if body.store else None, caller, body, conversation, connection, thread)
        if body.stream:
            events = ResponseEvents(base, output, socket_frame if connection is not None else named_sse)

            async def end(usage: Usage) -> str:
                return events.end(await kept(output.response(base)))

            framing = Framing(error=events.error, end=None)
            frames = streamed(opened.generation, answer.tally, events.feed, record, end, framing)
            return Reply(headers, events=frames)
        await whole(opened.generation, answer.tally, output.feed)
        return Reply(headers, body=(await kept(output.response(base))).model_dump())

    async def compact(
        self, body: CompactRequest, record: RequestRecord, store: ResponseStorePort | None, caller: Caller
    ) -> dict:
        """The conversation (that of `previous_response_id`, the caller's, then the input) compacted:
        its user messages and the summary that the model writes of it, with the summary's usage.
        """
        items = _items(await _conversation(store, body.previous_response_id, caller)) + body.items
        if not items:
            raise InvalidRequestError("Nothing to compact: send input, previous_response_id or both.", param="input")
        generation = await self._core.generate(
            [summary_request(body.instructions, items)], self._core.deadline(), record
        )
        answer = Answer(1, None)
        summary: list[str] = []

        def feed(chunk: GenerateChunk) -> None:
            summary.extend(event.text for event in answer.feed(chunk) if isinstance(event, Text))

        await whole(generation, answer.tally, feed)
        output = compacted_output(items, "".join(summary))
        usage = response_usage(answer.tally.usage())
        return CompactedResponse(id=item_id("resp"), output=output, usage=usage).model_dump()


async def _conversation(
    store: ResponseStorePort | None, previous: str | None, caller: Caller, connection: ConnectionCache | None = None
) -> list[dict[str, Any]]:
    """The items of the conversation that `previous` (a response's id) ended: its input and output,
    and those it continued.
    """
    if previous is None:
        return []
    earlier = await earlier_entry(store, previous, caller, connection)
    return earlier["conversation"] + [as_input(item) for item in earlier["response"]["output"]]


def _items(conversation: list[dict[str, Any]]) -> list[Item]:
    """Stored items as the request's models (they were validated when they came)."""
    parsed = ResponseRequest.model_validate({"model": "-", "input": conversation}) if conversation else None
    return parsed.items if parsed is not None else []


class _Thread:
    """The conversation a response belongs to (`conversation`; none: `conversation_id` None): its
    items before the input, and the turn's items added once the response completes.
    """

    def __init__(self, conversations: ConversationPort | None, conversation_id: str | None, caller: Caller) -> None:
        if conversation_id is not None and conversations is None:
            raise InvalidRequestError(
                "Conversations are not served here (a batch line has none).", param="conversation"
            )
        self._conversations = conversations
        self._id = conversation_id
        self._caller = caller

    async def history(self) -> list[dict[str, Any]]:
        """The conversation's items as input (none without a conversation); a 400 when it is full."""
        if self._conversations is None or self._id is None:
            return []
        conversations, conversation_id = self._conversations, self._id

        def read() -> list[dict[str, Any]]:
            conversations.check_room(conversation_id, self._caller)
            return conversations.items(conversation_id, self._caller)

        return [continued(item) for item in await asyncio.to_thread(read)]

    async def add(self, items: list[dict[str, Any]]) -> None:
        """Add the turn's input and output (whole, even past the conversation's cap: it started within it)."""
        if self._conversations is None or self._id is None:
            return
        try:
            await asyncio.to_thread(self._conversations.add, self._id, items, self._caller, True)
        except ObjectNotFoundError:  # deleted while the response ran: the response stands
            logger.warning(
                "request %s: conversation %r was deleted before the response was added",
                self._caller.request_id,
                self._id,
            )


class _Keeper:
    """Keeps a finished response in the store (when there is one and `store` is true) and on its
    WebSocket connection (a turn of that mode), as the caller's, with the request's input items and the
    conversation before them.
    """

    def __init__(
        self,
        store: ResponseStorePort | None,
        caller: Caller,
        body: ResponseRequest,
        conversation: list[dict[str, Any]],
        connection: ConnectionCache | None,
        thread: _Thread,
    ):
        self._store = store
        self._thread = thread
        self._caller = caller
        self._input = [stored_item(item) for item in body.items]
        self._conversation = conversation
        self._connection = connection

    async def __call__(self, response: Response) -> Response:
        entry: Entry = {
            "response": response.model_dump(),
            "input": self._input,
            "conversation": self._conversation + self._input,
        }
        if self._store is not None:
            await self._store.put(response.id, entry, self._caller)
        if self._connection is not None:
            self._connection.remember(response.id, entry)
        await self._thread.add(self._input + entry["response"]["output"])
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
        conversation={"id": body.conversation_id} if body.conversation_id is not None else None,
        user=body.user,
        system_fingerprint=DEGRADED_FINGERPRINT if degraded else None,
        vision=degraded.report if degraded else None,
    )
