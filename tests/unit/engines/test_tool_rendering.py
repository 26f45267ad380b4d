"""Tools in the engines' prompts: the model's own template (Hermes here), the generic format for a
template without tools (SmolLM2's), the format read from a template or set in models.yaml, a
`chat_template` override, and the special tokens that open calls kept in the decoded text."""

from __future__ import annotations

import json
import shutil

import pytest
from transformers import AutoTokenizer

from deployments.config import EngineParams, ModelConfig
from deployments.engines import TextEngine, create_text_engine
from deployments.engines.transformers.chat_template import marker_token_ids
from deployments.engines.transformers.stream import IncrementalText
from deployments.errors import ConfigError
from deployments.protocol.openai.common import ToolCall, ToolCallFunction
from deployments.protocol.replica import GenerateRequest, TextMessage
from deployments.tools.calls import ToolCallText
from deployments.tools.plan import ToolPlan
from deployments.tools.prompt import detect_tool_format, generic_chat, tool_prompt

HERMES_TEMPLATE = """{%- if tools %}<|im_start|>system
Functions you may call, in <tools></tools>:
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
Call one as <tool_call>{"name": <name>, "arguments": <object>}</tool_call><|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == "assistant" and message.tool_calls %}<|im_start|>assistant
{{ message.content }}
{%- for call in message.tool_calls %}<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% elif message.role == "tool" %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CALL = ToolCall(id="call_1", function=ToolCallFunction(name="get_weather", arguments='{"city": "Paris"}'))
ROUND_TRIP = [
    TextMessage(role="user", content="Weather in Paris?"),
    TextMessage(role="assistant", content="", tool_calls=[CALL]),
    TextMessage(role="tool", content="18C and sunny", tool_call_id="call_1"),
]


def engine_with(directory, **model) -> TextEngine:
    params = EngineParams(batching="sequential", max_num_seqs=2)
    return create_text_engine(ModelConfig(name="tools", local_path=str(directory), params=params, **model))


@pytest.fixture(scope="module")
def model_copy(tmp_path_factory, tiny_llm_dir):
    def copy(template: str | None = None):
        directory = tmp_path_factory.mktemp("tiny-tools")
        shutil.copytree(tiny_llm_dir, directory, dirs_exist_ok=True)
        if template is not None:
            (directory / "chat_template.jinja").write_text(template)
        return directory

    return copy


@pytest.fixture(scope="module")
def tool_llm(model_copy) -> TextEngine:
    """The tiny model with a Hermes-style template (Qwen2.5's conventions)."""
    engine = engine_with(model_copy(HERMES_TEMPLATE))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def plain_llm(model_copy) -> TextEngine:
    """The tiny model with SmolLM2's template, which never reads `tools`."""
    engine = engine_with(model_copy())
    yield engine
    engine.close()


async def complete(engine: TextEngine, request: GenerateRequest):
    pieces = [p async for p in engine.generate(request)]
    return "".join(p.text for p in pieces), pieces


async def test_tools_and_a_tool_call_history_reach_the_template(tool_llm):
    request = GenerateRequest(messages=ROUND_TRIP, tools=[WEATHER], temperature=0, max_tokens=4)
    assert tool_llm.describe()["tool_call_format"] == "hermes"
    prompt = tool_llm.tokenizer.decode(tool_llm.chat_ids(request.messages, request.tools))
    assert '"name": "get_weather"' in prompt and "The weather in a city." in prompt  # the tool list
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<tool_response>\n18C and sunny\n</tool_response>" in prompt
    _, pieces = await complete(tool_llm, request)
    assert pieces[-1].completion_tokens > 0


async def test_a_template_without_tools_gets_the_generic_format(plain_llm):
    """SmolLM2's template never reads `tools`: the tools and the call format go into the system
    message, the earlier call and its result are text, and the model answers (no 400)."""
    assert plain_llm.describe()["tool_call_format"] == "generic"
    prompt = plain_llm.tokenizer.decode(plain_llm.chat_ids(ROUND_TRIP, [WEATHER]))
    system = prompt.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nYou can call these tools") and "The weather in a city." in system
    assert "SmolLM" not in prompt  # the template's default system message gave way to the tools'
    assert '<|im_start|>assistant\n[{"name": "get_weather", "arguments": {"city": "Paris"}}]<|im_end|>' in prompt
    assert "<|im_start|>user\nTool results:\nget_weather (call_1): 18C and sunny<|im_end|>" in prompt
    without_tools = plain_llm.tokenizer.decode(plain_llm.chat_ids(ROUND_TRIP, None))  # tool_choice none
    assert "You can call" not in without_tools and "Tool results:" in without_tools
    _, pieces = await complete(plain_llm, GenerateRequest(messages=ROUND_TRIP, tools=[WEATHER], max_tokens=3))
    assert pieces[-1].completion_tokens > 0


def test_the_generic_prompt_teaches_what_the_ingress_parses():
    """The prompt's example call, and a history's call as the prompt writes it, parse as calls."""
    example = tool_prompt([WEATHER]).split("for example:\n")[1].splitlines()[0]
    assert example == '[{"name": "get_weather", "arguments": {"city": "..."}}]'
    chat = generic_chat([{"role": "assistant", "content": "Let me see.", "tool_calls": [CALL.model_dump()]}], None)
    written = chat[0]["content"].split("\n", 1)[1]
    calls = []
    for text in (example, written):
        reader = ToolCallText(ToolPlan("auto", names=frozenset({"get_weather"})))
        reader.use("generic")
        reader.feed(text)
        reader.finish()
        calls += [(c.function.name, json.loads(c.function.arguments)) for c in reader.calls]
    assert calls == [("get_weather", {"city": "..."}), ("get_weather", {"city": "Paris"})]


def test_the_generic_prompt_goes_where_the_template_takes_it():
    tools = [WEATHER]
    chat = generic_chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}], tools)
    assert chat[0]["role"] == "system" and chat[0]["content"].endswith("\n\nBe brief.")
    assert chat[0]["content"].startswith("You can call these tools")
    assert [m["role"] for m in generic_chat([{"role": "user", "content": "hi"}], tools)] == ["system", "user"]
    no_system = generic_chat([{"role": "user", "content": "hi"}], tools, system_role=False)
    assert (
        len(no_system) == 1
        and no_system[0]["content"].startswith("You can call")
        and no_system[0]["content"].endswith("hi")
    )
    results = generic_chat(
        [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [CALL.model_dump(), {**CALL.model_dump(), "id": "c2"}],
            },
            {"role": "tool", "content": "18C", "tool_call_id": "call_1"},
            {"role": "tool", "content": "19C", "tool_call_id": "c2"},
        ],
        None,
    )
    assert results[1] == {"role": "user", "content": "Tool results:\nget_weather (call_1): 18C\nget_weather (c2): 19C"}


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (HERMES_TEMPLATE, "hermes"),
        ("{{ '[AVAILABLE_TOOLS]' + tools|tojson }}{% if m %}[TOOL_CALLS]{{ calls }}{% endif %}", "mistral"),
        (
            '{{- \'<|python_tag|>\' + tool_call.name }}Respond with {"name": function name, "parameters": ...}',
            "llama3_json",
        ),
        ("Respond as [func_name1(params_name1=params_value1), func_name2(params)]", "pythonic"),
        ("{{ '<|python_start|>' }}{% for t in tool_calls %}{{ t.name }}(...){% endfor %}", "pythonic"),
        ("{% for message in messages %}{{ message.content }}{% endfor %}", None),
    ],
)
def test_the_format_is_read_from_the_template(template, expected):
    assert detect_tool_format(template) == expected


def test_the_configured_format_and_a_template_override(model_copy, tmp_path):
    with pytest.raises(ConfigError, match="tool_call_format is hermes, but its chat template does not render tools"):
        engine_with(model_copy(), capabilities={"tool_call_format": "hermes"})
    generic = engine_with(model_copy(HERMES_TEMPLATE), capabilities={"tool_call_format": "generic"})
    try:
        prompt = generic.tokenizer.decode(generic.chat_ids(ROUND_TRIP, [WEATHER]))
        assert "<tools>" not in prompt and "You can call these tools" in prompt and "Tool results:" in prompt
    finally:
        generic.close()
    template = tmp_path / "hermes.jinja"
    template.write_text(HERMES_TEMPLATE)
    overridden = engine_with(model_copy(), chat_template=str(template))
    try:
        assert overridden.describe()["tool_call_format"] == "hermes"
        assert "<tools>" in overridden.tokenizer.decode(overridden.chat_ids(ROUND_TRIP, [WEATHER]))
    finally:
        overridden.close()


def test_the_special_token_that_opens_calls_stays_in_the_text(tiny_llm_dir):
    """Mistral's [TOOL_CALLS] is a special token: decoded as usual it would vanish, and with it the
    place where the calls start; the other special tokens (EOS) still go."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_llm_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": ["[TOOL_CALLS]"]})
    keep = marker_token_ids(tokenizer, "mistral")
    assert keep == {tokenizer.convert_tokens_to_ids("[TOOL_CALLS]")}
    ids = [*tokenizer("Sure.[TOOL_CALLS] [1]", add_special_tokens=False).input_ids, tokenizer.eos_token_id]
    for kept, expected in ((keep, "Sure.[TOOL_CALLS] [1]"), (frozenset(), "Sure. [1]")):
        text = IncrementalText(tokenizer, kept)
        assert text.feed(ids) + text.flush() == expected
    assert marker_token_ids(tokenizer, "hermes") == frozenset()
