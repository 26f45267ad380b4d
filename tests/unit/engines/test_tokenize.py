"""Every engine's `tokenize` and `detokenize` (/tokenize, /detokenize, count_tokens): the fake, a tiny
transformers LLM (built locally, loaded through the real loading code), the tiny transformers VLM
(native vision: the processor's image tokens), the offline default SmolLM2 GGUF on llama.cpp, and
the tiny GGUF VLM on llama.cpp. A chat's count is the prompt `generate` is given (its reported
prompt tokens); text round-trips; an id outside the vocabulary is a 400."""

from __future__ import annotations

import hashlib

import pytest

from deployments.config import ModelConfig
from deployments.engines import TextEngine, create_text_engine
from deployments.errors import InvalidRequestError
from deployments.protocol.replica import (
    GenerateRequest,
    ImageBytes,
    MessageImage,
    MessageText,
    TextMessage,
    TokenizeInput,
)
from tests.conftest import png_bytes
from tests.unit.engines.test_llamacpp import llamacpp_model
from tests.unit.engines.test_llamacpp_vision import vlm_model
from tests.unit.engines.test_native import native

TEXT = "The capital of France is Paris."
CHAT = [
    TextMessage(role="system", content="Be brief."),
    TextMessage(role="user", content="What is the capital of France?"),
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}]


def engine_of(model: ModelConfig):
    engine = create_text_engine(model)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def fake():
    yield from engine_of(ModelConfig(name="echo", engine="fake"))


@pytest.fixture(scope="module")
def transformers_llm(tiny_llm_dir):
    yield from engine_of(ModelConfig(name="tiny", local_path=str(tiny_llm_dir), params={"max_num_seqs": 2}))


@pytest.fixture(scope="module")
def llamacpp(smollm2):
    yield from engine_of(llamacpp_model(smollm2))


@pytest.fixture(scope="module")
def transformers_vlm(tiny_vlm_dir):
    yield from engine_of(native(tiny_vlm_dir))


@pytest.fixture(scope="module")
def llamacpp_vlm(tiny_gguf_vlm_dir):
    yield from engine_of(vlm_model(tiny_gguf_vlm_dir))


TEXT_ENGINES = ["fake", "transformers_llm", "llamacpp"]


async def prompt_tokens(engine: TextEngine, request: GenerateRequest) -> int:
    """What `generate` reports as the prompt's tokens (one token generated)."""
    pieces = [p async for p in engine.generate(request.model_copy(update={"max_tokens": 1, "temperature": 0}))]
    return pieces[-1].prompt_tokens


@pytest.mark.parametrize("name", TEXT_ENGINES)
async def test_a_chats_count_is_the_prompt_generate_is_given(request, name):
    engine = request.getfixturevalue(name)
    counted = engine.tokenize(TokenizeInput(messages=CHAT))
    assert counted.count == len(counted.tokens) == await prompt_tokens(engine, GenerateRequest(messages=CHAT))
    assert counted.image_tokens == 0 and counted.token_strs is None
    legacy = engine.tokenize(TokenizeInput(prompt=TEXT))
    assert legacy.count == await prompt_tokens(engine, GenerateRequest(prompt=TEXT))


@pytest.mark.parametrize("name", ["transformers_llm", "llamacpp"])
async def test_tools_are_rendered_as_a_chat_with_tools_is_prompted(request, name):
    engine = request.getfixturevalue(name)
    with_tools = engine.tokenize(TokenizeInput(messages=CHAT, tools=TOOLS))
    assert with_tools.count == await prompt_tokens(engine, GenerateRequest(messages=CHAT, tools=TOOLS))
    assert with_tools.count > engine.tokenize(TokenizeInput(messages=CHAT)).count


@pytest.mark.parametrize("name", TEXT_ENGINES)
def test_text_round_trips_through_detokenize_and_token_strs_line_up(request, name):
    engine = request.getfixturevalue(name)
    counted = engine.tokenize(TokenizeInput(prompt=TEXT, add_special_tokens=False, return_token_strs=True))
    assert counted.token_strs is not None and len(counted.token_strs) == len(counted.tokens) > 1
    assert engine.detokenize(counted.tokens) == TEXT
    assert engine.detokenize([]) == ""
    chat = engine.tokenize(TokenizeInput(messages=CHAT))
    assert "What is the capital of France?" in engine.detokenize(chat.tokens)


@pytest.mark.parametrize("name", TEXT_ENGINES)
def test_an_id_outside_the_vocabulary_is_a_400(request, name):
    engine = request.getfixturevalue(name)
    with pytest.raises(InvalidRequestError, match="outside the vocabulary") as err:
        engine.detokenize([1, 10**9])
    assert err.value.param == "tokens"


@pytest.mark.parametrize("name", ["transformers_llm", "llamacpp"])
def test_the_generation_prompt_and_a_continued_final_message(request, name):
    engine = request.getfixturevalue(name)
    full = engine.tokenize(TokenizeInput(messages=CHAT))
    bare = engine.tokenize(TokenizeInput(messages=CHAT, add_generation_prompt=False))
    assert bare.tokens == full.tokens[: len(bare.tokens)] and bare.count < full.count
    prefill = [*CHAT, TextMessage(role="assistant", content="The capital")]
    continued = engine.tokenize(
        TokenizeInput(messages=prefill, add_generation_prompt=False, continue_final_message=True)
    )
    assert engine.detokenize(continued.tokens).endswith("The capital")
    assert continued.tokens[: len(full.tokens)] == full.tokens  # the answer's opening, then the prefill


def test_llamacpp_always_continues_a_final_assistant_message_so_it_must_be_asked_for(llamacpp):
    prefill = [*CHAT, TextMessage(role="assistant", content="The capital")]
    with pytest.raises(InvalidRequestError, match="continue_final_message"):
        llamacpp.tokenize(TokenizeInput(messages=prefill))


def test_token_strs_are_each_engines_own(transformers_llm, llamacpp):
    words = transformers_llm.tokenize(TokenizeInput(prompt=" Paris", add_special_tokens=False, return_token_strs=True))
    assert words.token_strs == transformers_llm.tokenizer.convert_ids_to_tokens(words.tokens)  # e.g. "ĠParis"
    pieces = llamacpp.tokenize(TokenizeInput(prompt=" Paris", add_special_tokens=False, return_token_strs=True))
    assert "".join(pieces.token_strs or []) == " Paris"  # llama.cpp's pieces are the tokens' text


def picture(colour: tuple[int, int, int]) -> ImageBytes:
    data = png_bytes(colour)
    return ImageBytes(data=data, sha256=hashlib.sha256(data).hexdigest())


def looking(images: int) -> tuple[list[TextMessage], list[ImageBytes]]:
    parts = [MessageText(text="What is it?"), *(MessageImage(index=i) for i in range(images))]
    messages = [TextMessage(role="user", content="What is it?", parts=parts)]
    return messages, [picture((i, 2, 3)) for i in range(images)]


@pytest.mark.parametrize("name", ["transformers_vlm", "llamacpp_vlm"])
async def test_a_native_vlm_counts_its_image_tokens_as_it_prompts(request, name):
    engine = request.getfixturevalue(name)
    one, two = (engine.tokenize(TokenizeInput(messages=m, images=i)) for m, i in (looking(1), looking(2)))
    assert one.image_tokens > 0 and two.image_tokens == 2 * one.image_tokens
    messages, images = looking(2)
    assert two.count == await prompt_tokens(engine, GenerateRequest(messages=messages, images=images))
    text_only = engine.tokenize(TokenizeInput(messages=[TextMessage(role="user", content="What is it?")]))
    assert text_only.image_tokens == 0 and text_only.count < one.count


def test_a_transformers_vlm_lists_the_placeholders_expansion_and_llamacpp_only_the_text(transformers_vlm, llamacpp_vlm):
    messages, images = looking(1)
    listed = transformers_vlm.tokenize(TokenizeInput(messages=messages, images=images))
    assert listed.count == len(listed.tokens)
    assert listed.tokens.count(transformers_vlm.prompts.image_token_id) == listed.image_tokens
    text = llamacpp_vlm.tokenize(TokenizeInput(messages=messages, images=images, return_token_strs=True))
    assert text.count == len(text.tokens) + text.image_tokens
    assert text.token_strs is not None and len(text.token_strs) == len(text.tokens)
