"""Agent clients that call /v1/responses, against the ingress's app over a fake decoder, no Ray: an
OpenAI Agents SDK agent on its default model (`OpenAIResponsesModel`) with a function tool (its
first call gets the tool call, the SDK runs the tool and sends its output back, and the second
call's answer is the agent's final output, whole and streamed), and LangChain's
`ChatOpenAI(use_responses_api=True)` (invoke, stream, bind_tools)."""

from __future__ import annotations

import openai
from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from langchain_openai import ChatOpenAI

from tests.unit.ingress.fakes import FakeDecoder
from tests.unit.ingress.test_responses import CALL, http

set_tracing_disabled(True)


def weather_agent(decoder: FakeDecoder, client: openai.AsyncOpenAI, asked: list[str]) -> Agent:
    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        asked.append(city)
        decoder.pieces = ["Sunny in Paris."]  # what the model says once it has the tool's output
        return "sunny, 21 C"

    model = OpenAIResponsesModel(model="echo", openai_client=client)
    return Agent(name="weather", instructions="Use the tool.", tools=[get_weather], model=model)


async def test_an_agent_calls_its_tool_and_answers_whole_and_streamed():
    decoder = FakeDecoder([CALL])
    decoder.tool_format = "hermes"
    asked: list[str] = []
    async with http(decoder) as transport:
        client = openai.AsyncOpenAI(base_url="http://test/v1", api_key="none", http_client=transport, max_retries=0)
        agent = weather_agent(decoder, client, asked)
        result = await Runner.run(agent, "Weather in Paris?")
        assert result.final_output == "Sunny in Paris." and asked == ["Paris"]
        sent = decoder.requests[-1].messages
        assert [m.role for m in sent] == ["system", "user", "assistant", "tool"] and sent[3].content == "sunny, 21 C"
        decoder.pieces = [CALL]
        streamed = Runner.run_streamed(agent, "Weather in Paris?")
        kinds = {event.type async for event in streamed.stream_events()}
    assert streamed.final_output == "Sunny in Paris." and asked == ["Paris", "Paris"]
    assert "raw_response_event" in kinds


def get_weather(city: str) -> str:
    """The weather in a city."""
    return "sunny"


async def test_langchain_on_the_responses_api_invokes_streams_and_binds_tools():
    decoder = FakeDecoder(["Hello", " there"])
    async with http(decoder) as transport:
        llm = ChatOpenAI(
            model="echo",
            base_url="http://test/v1",
            api_key="none",
            use_responses_api=True,
            http_async_client=transport,
            max_retries=0,
        )
        message = await llm.ainvoke("hi")
        assert message.text == "Hello there" and message.usage_metadata["total_tokens"] == 5
        assert "".join([chunk.text async for chunk in llm.astream("hi")]) == "Hello there"
        decoder.pieces, decoder.tool_format = [CALL], "hermes"
        tooled = llm.bind_tools([get_weather])
        called = await tooled.ainvoke("Weather in Paris?")
        whole = None
        async for chunk in tooled.astream("Weather in Paris?"):
            whole = chunk if whole is None else whole + chunk
    assert [(call["name"], call["args"]) for call in called.tool_calls] == [("get_weather", {"city": "Paris"})]
    assert whole is not None and [call["args"] for call in whole.tool_calls] == [{"city": "Paris"}]
