import pytest
from pydantic import ValidationError

from deployments.errors import validation_message
from deployments.protocol.openai.chat import ChatCompletionRequest, UserMessage
from deployments.protocol.openai.common import ImagePart


def req(**kw):
    return ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw})


def test_string_and_parts_content():
    r = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is this?"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
                    ],
                },
            ],
        }
    )
    user = r.messages[1]
    assert isinstance(user, UserMessage) and isinstance(user.content[1], ImagePart)


def test_max_completion_tokens_wins():
    assert req(max_tokens=10, max_completion_tokens=20).completion_limit == 20
    assert req(max_tokens=10).completion_limit == 10
    assert req().completion_limit is None


def test_stop_normalised_and_bounded():
    assert req(stop="x").stop_sequences == ["x"]
    with pytest.raises(ValidationError):
        req(stop=["a", "b", "c", "d", "e"])
    with pytest.raises(ValidationError):
        req(stop=[""])


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 0}, "n"),
        ({"n": 129}, "n"),
        ({"temperature": 2.5}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"tools": "calculator"}, "tools"),
        ({"logit_bias": {"1": 200}}, "logit_bias.1"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),  # without stream: true, as OpenAI
        ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
        ({"tool_choice": "required"}, "tool_choice"),  # without tools
        ({"audio": {"voice": "alloy"}}, "audio"),  # OpenAI's, not ours: named, never ignored
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ],
)
def test_unsupported_or_out_of_range_fields_name_their_param(extra, param):
    with pytest.raises(ValidationError) as err:
        req(**extra)
    assert validation_message(err.value.errors())[1] == param


def test_bare_string_image_url_points_at_the_part():
    with pytest.raises(ValidationError) as err:
        ChatCompletionRequest.model_validate(
            {"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "data:x"}]}]}
        )
    message, param = validation_message(err.value.errors())
    assert param == "messages[0].content[0].image_url"
    assert "dictionary" in message or "object" in message


def test_images_only_in_user_messages():
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate(
            {
                "model": "m",
                "messages": [{"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": "data:x"}}]}],
            }
        )


def test_bad_role_rejected():
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "wizard", "content": "x"}]})


@pytest.mark.parametrize("kind", ["chat", "completions"])
def test_every_field_the_openai_client_sends_is_declared_and_in_the_docs_table(kind):
    """Each is honoured, refused with a 400 naming it, or harmless; none falls to "unknown field",
    and the API reference's table of request fields (docs/api.md) lists each one."""
    import inspect
    from pathlib import Path

    from openai.resources.chat.completions import Completions as Chat
    from openai.resources.completions import Completions as Legacy

    from deployments.protocol.openai.completions import CompletionRequest

    create, model = (Chat.create, ChatCompletionRequest) if kind == "chat" else (Legacy.create, CompletionRequest)
    sent = set(inspect.signature(create).parameters) - {"self", "extra_headers", "extra_query", "extra_body", "timeout"}
    assert sent - set(model.model_fields) == set()
    page = Path(__file__).resolve().parents[3].joinpath("docs", "api.md").read_text()
    table = page.split("\n## Request fields\n", 1)[1].split("\n## ", 1)[0]
    table = "\n".join(line for line in table.splitlines() if line.startswith("| "))
    assert {name for name in sent if f"`{name}`" not in table} == set()
