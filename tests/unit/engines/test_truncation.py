"""`params.context_overflow` in the engines: the tiny real model (both batching engines) and the
shipped fake one. A long chat is a 400 under ``error``; under ``truncate`` it is answered from the
system prompt and the latest turns, and the last piece says how many prompt tokens were dropped."""

from __future__ import annotations

import pytest

from deployments.config import EngineParams, ModelConfig
from deployments.engines import create_text_engine
from deployments.engines.fake import echoed_prompt
from deployments.engines.transformers.text import TransformersTextEngine
from deployments.errors import ContextLengthError
from deployments.protocol.replica import GenerateRequest, TextMessage

SYSTEM = "You are the keeper of the lighthouse."
LAST = "What colour is the lamp tonight?"


def long_chat(turns: int = 6, words: int = 40, **kw) -> GenerateRequest:
    messages = [TextMessage(role="system", content=SYSTEM)]
    for i in range(turns):
        messages.append(TextMessage(role="user", content=f"question {i}: " + " ".join(["ship"] * words)))
        messages.append(TextMessage(role="assistant", content=f"answer {i}: " + " ".join(["wave"] * words)))
    messages.append(TextMessage(role="user", content=LAST))
    return GenerateRequest(messages=messages, **kw)


async def complete(engine, request: GenerateRequest):
    return [p async for p in engine.generate(request)]


@pytest.fixture(scope="module", params=["continuous", "sequential"])
def engines(request, tiny_llm_dir):
    """The same tiny model twice, at 256 tokens of context: overflow `error` and `truncate`."""
    made = {
        overflow: create_text_engine(
            ModelConfig(
                name=f"tiny-{overflow}",
                local_path=str(tiny_llm_dir),
                params=EngineParams(
                    batching=request.param, max_model_len=256, context_overflow=overflow, max_num_seqs=2
                ),
            )
        )
        for overflow in ("error", "truncate")
    }
    yield made
    for engine in made.values():
        engine.close()


async def test_a_long_chat_is_a_400_under_error_and_truncated_whole_turns_under_truncate(engines):
    request = long_chat(max_tokens=8, temperature=0)
    error, truncate = engines["error"], engines["truncate"]
    whole = len(truncate.chat_ids(request.messages, request.tools))
    assert whole > 256
    with pytest.raises(ContextLengthError, match=f"context is 256 tokens; the prompt has {whole} and 8"):
        await complete(error, request)

    out = await complete(truncate, request)
    last = out[-1]
    assert last.finish_reason in ("stop", "length") and 0 < last.completion_tokens <= 8
    assert last.truncated_prompt_tokens > 0
    assert last.prompt_tokens + last.truncated_prompt_tokens == whole  # the template's tokens of the turns dropped
    assert last.prompt_tokens + 8 <= 256
    # what the model read: the system prompt, whole later turns, the last question
    prepared = await truncate.prepare(request)
    assert len(prepared.prompt) == last.prompt_tokens
    prompt = truncate.tokenizer.decode(prepared.prompt)
    assert SYSTEM in prompt and LAST in prompt and "question 0:" not in prompt
    kept = [m for m in request.messages[1:] if m.content.split(":")[0] in prompt]
    assert kept == request.messages[len(request.messages) - len(kept) :]  # a suffix of whole messages
    assert len(kept) % 2 == 1  # user/assistant pairs, then the last question


async def test_a_chat_that_fits_is_not_truncated(engines):
    out = await complete(engines["truncate"], long_chat(turns=1, words=5, max_tokens=4))
    assert out[-1].truncated_prompt_tokens == 0


async def test_a_legacy_prompt_is_never_cut(engines):
    with pytest.raises(ContextLengthError) as raised:
        await complete(engines["truncate"], GenerateRequest(prompt="ship " * 300, max_tokens=4))
    assert raised.value.param == "prompt"


def test_both_batching_engines_share_the_fitting(engines):
    assert all(isinstance(engine, TransformersTextEngine) for engine in engines.values())
    assert engines["truncate"].describe()["context_overflow"] == "truncate"


# --------------------------------------------------------------------------- the fake engine


def fake(**params) -> object:
    return create_text_engine(ModelConfig(name="echo", engine="fake", params=EngineParams(**params)))


async def test_the_fake_counts_words_and_echoes_only_the_turns_it_kept():
    request = long_chat(turns=3, words=10, max_tokens=40)
    engine = fake(max_model_len=80, context_overflow="truncate")
    out = await complete(engine, request)
    echo = "".join(p.text for p in out)
    assert echo.splitlines()[0] == f"system: {SYSTEM}" and echo.endswith(f"user: {LAST}")
    assert "question 0" not in echo and "question 2" in echo  # one turn (12 + 12 words) too many
    assert out[-1].prompt_tokens + 40 <= 80 and out[-1].prompt_tokens == len(echo.split(" "))
    assert out[-1].truncated_prompt_tokens == len(echoed_prompt(request).split(" ")) - out[-1].prompt_tokens > 0


async def test_the_fake_keeps_todays_behaviour_without_max_model_len():
    request = long_chat(turns=3, words=10, max_tokens=400)
    out = await complete(fake(context_overflow="truncate"), request)
    assert out[-1].truncated_prompt_tokens == 0 and "question 0" in "".join(p.text for p in out)
    with pytest.raises(ContextLengthError, match="context is 80 tokens"):
        await complete(fake(max_model_len=80), long_chat(turns=3, words=10, max_tokens=40))
