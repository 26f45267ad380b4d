"""vLLM's request extensions on the transformers engines (continuous, static and sequential batching)
and on llama.cpp, on the tiny Llama and the offline default GGUF: the end of sequence ignored or
held back, stop token ids, special tokens in the text, the chat template's variables and its final
message continued, the repetition penalty, and structured outputs' regex, choice and grammar."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from deployments.config import EngineParams, ModelConfig
from deployments.engines import TextEngine, create_text_engine
from deployments.engines.llamacpp import LlamaCppTextEngine
from deployments.errors import InvalidRequestError
from deployments.protocol.replica import GenerateRequest, GrammarSpec, TextMessage
from tests.unit.engines.test_llamacpp import llamacpp_model

EOS, IM_START = 2, 1  # the SmolLM2 tokenizer's <|im_end|> (its end of sequence) and <|im_start|>
TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}{{ greeting | default('') }}"
)


def ask(text: str = "hello there", **kw) -> GenerateRequest:
    return GenerateRequest(messages=[TextMessage(role="user", content=text)], temperature=0, **kw)


async def complete(engine: TextEngine, request: GenerateRequest):
    """The answer's text and last piece, once the engine let the sequence go (a stop token closes it
    early; the batch's thread must not hand this test's event loop anything after it closes)."""
    try:
        pieces = [p async for p in engine.generate(request)]
    finally:
        for _ in range(500):
            stats = engine.stats()
            if not stats.get("running", 0) + stats.get("waiting", 0):
                break
            await asyncio.sleep(0.01)
    return "".join(p.text for p in pieces), pieces[-1]


@pytest.fixture(scope="module", params=["continuous", "static", "sequential", "llama.cpp"])
def engine(request, tiny_llm_dir, smollm2: Path) -> TextEngine:
    if request.param == "llama.cpp":
        built = create_text_engine(llamacpp_model(smollm2, max_num_seqs=2))
    else:
        params = EngineParams(batching=request.param, max_num_seqs=2)
        built = create_text_engine(ModelConfig(name="tiny", local_path=str(tiny_llm_dir), params=params))
    yield built
    built.close()


@pytest.fixture
def tiny_llm(engine: TextEngine) -> TextEngine:
    if isinstance(engine, LlamaCppTextEngine):
        pytest.skip("transformers only")
    return engine


@pytest.fixture
def llama(engine: TextEngine) -> TextEngine:
    if not isinstance(engine, LlamaCppTextEngine):
        pytest.skip("llama.cpp only")
    return engine


def token_of(engine: TextEngine, text: str) -> int:
    tokenizer = getattr(engine, "tokenizer", None)
    ids = tokenizer.encode(text, add_special_tokens=False) if tokenizer else engine.text_tokens(text, False)[0]
    return int(ids[0])


async def test_ignore_eos_goes_on_to_max_tokens(engine):
    forced = {EOS: 100.0}  # the end of sequence first, unless ignored
    _, last = await complete(engine, ask(max_tokens=6, logit_bias=forced))
    assert last.finish_reason == "stop" and last.completion_tokens <= 1
    _, last = await complete(engine, ask(max_tokens=6, logit_bias=forced, ignore_eos=True))
    assert (last.finish_reason, last.completion_tokens) == ("length", 6)


async def test_stop_token_ids_end_the_answer_and_are_kept_only_when_asked(engine):
    paris = token_of(engine, " Paris")
    forced = {paris: 100.0}
    text, last = await complete(engine, ask(max_tokens=6, logit_bias=forced))
    assert text == " Paris" * 6 and last.finish_reason == "length"
    text, last = await complete(engine, ask(max_tokens=6, logit_bias=forced, stop_token_ids=[paris]))
    assert (text, last.finish_reason, last.completion_tokens) == ("", "stop", 1)
    kept = ask(max_tokens=6, logit_bias=forced, stop_token_ids=[paris], include_stop_str_in_output=True)
    text, last = await complete(engine, kept)
    assert (text, last.finish_reason) == (" Paris", "stop")


async def test_a_stop_token_id_outside_the_vocabulary_is_a_400(engine):
    with pytest.raises(InvalidRequestError) as caught:
        await complete(engine, ask(max_tokens=2, stop_token_ids=[10**9]))
    assert caught.value.param == "stop_token_ids"


async def test_repetition_penalty_changes_a_greedy_answer_and_stays_reproducible(engine):
    """A legacy prompt on which both models repeat themselves greedily (the tiny one loops on two tokens)."""
    prompt = "the the the the the"
    plain, _ = await complete(engine, GenerateRequest(prompt=prompt, temperature=0, max_tokens=30))
    penalized = GenerateRequest(prompt=prompt, temperature=0, max_tokens=30, repetition_penalty=5.0)
    first, _ = await complete(engine, penalized)
    again, _ = await complete(engine, penalized)
    assert first == again and first != plain


@pytest.mark.parametrize(
    ("spec", "check"),
    [
        (GrammarSpec(kind="choice", choices=["yes", "no"]), lambda text: text in ("yes", "no")),
        (GrammarSpec(kind="regex", pattern="[0-9]{3}"), lambda text: re.fullmatch("[0-9]{3}", text)),
        (GrammarSpec(kind="grammar", pattern='root ::= "ab" | "cd"'), lambda text: text in ("ab", "cd")),
        (GrammarSpec(kind="grammar", pattern='start: "x" "y"+'), lambda text: re.fullmatch("xy+", text)),
    ],
)
async def test_structured_outputs_regex_choice_and_grammar(engine, spec, check):
    text, _ = await complete(engine, ask(max_tokens=8, grammar=spec))
    assert check(text), text


async def test_an_invalid_grammar_is_a_400_naming_structured_outputs(engine):
    spec = GrammarSpec(kind="grammar", pattern="root ::= (", param="structured_outputs")
    with pytest.raises(InvalidRequestError) as caught:
        await complete(engine, ask(max_tokens=2, grammar=spec))
    assert caught.value.param == "structured_outputs"


# --------------------------------------------------------------------------- transformers only


async def test_min_tokens_holds_back_the_end_of_sequence_and_the_stop_token_ids(tiny_llm):
    _, last = await complete(tiny_llm, ask(max_tokens=12, logit_bias={EOS: 100.0}, min_tokens=4))
    assert last.finish_reason == "stop" and 4 <= last.completion_tokens <= 5  # the EOS itself may count
    paris = token_of(tiny_llm, " Paris")
    held = ask(max_tokens=12, logit_bias={paris: 100.0}, stop_token_ids=[paris], min_tokens=3)
    text, last = await complete(tiny_llm, held)
    assert (last.finish_reason, last.completion_tokens) == ("stop", 4) and "Paris" not in text


async def test_skip_special_tokens_false_keeps_them_in_the_text(tiny_llm):
    forced = {IM_START: 100.0}
    text, _ = await complete(tiny_llm, ask(max_tokens=3, logit_bias=forced))
    assert text == ""
    text, _ = await complete(tiny_llm, ask(max_tokens=3, logit_bias=forced, skip_special_tokens=False))
    assert text == "<|im_start|>" * 3


async def test_the_chat_rendering_takes_template_variables_and_continues_a_final_message(tiny_llm):
    tokenizer = tiny_llm.tokenizer
    saved, tokenizer.chat_template = tokenizer.chat_template, TEMPLATE
    try:

        async def prompt(**kw) -> str:
            return tokenizer.decode((await tiny_llm.prepare(GenerateRequest(**kw))).prompt)

        chat = [TextMessage(role="user", content="hi")]
        assert (await prompt(messages=chat)).endswith("</user><assistant>")
        assert (await prompt(messages=chat, chat_template_kwargs={"greeting": "HELLO"})).endswith("<assistant>HELLO")
        assert (await prompt(messages=chat, add_generation_prompt=False)).endswith("</user>")
        started = [*chat, TextMessage(role="assistant", content="The answer is")]
        kept = await prompt(messages=started, add_generation_prompt=False, continue_final_message=True)
        assert kept.endswith("<assistant>The answer is")
        for taken in ("tokenize", "conversations", "sanitize_control_tokens"):  # the rendering's own: 400s
            with pytest.raises(InvalidRequestError) as caught:
                await prompt(messages=chat, chat_template_kwargs={taken: True})
            assert caught.value.param == "chat_template_kwargs"
    finally:
        tokenizer.chat_template = saved


# --------------------------------------------------------------------------- llama.cpp only


@pytest.mark.parametrize(
    ("field", "why"),
    [({"min_tokens": 2}, "cannot hold the end of generation back"), ({"skip_special_tokens": False}, "whole server")],
)
async def test_llamacpp_refuses_what_it_cannot_honour_naming_the_field_and_why(llama, field, why):
    with pytest.raises(InvalidRequestError) as caught:
        await complete(llama, ask(max_tokens=4, **field))
    assert caught.value.param == next(iter(field)) and why in caught.value.message


async def test_llamacpp_passes_template_variables_and_leaves_out_the_generation_prompt(llama, monkeypatch):
    chat = [TextMessage(role="user", content="hi")]
    assert llama.render_chat(chat, None).endswith("<|im_start|>assistant\n")
    assert llama.render_chat(chat, None, add_generation_prompt=False).endswith("hi<|im_end|>\n")
    sent, call = [], llama._call
    monkeypatch.setattr(llama, "_call", lambda path, body, param: sent.append(body) or call(path, body, param))
    _, last = await complete(llama, ask(max_tokens=2, chat_template_kwargs={"enable_thinking": False}))
    assert sent[0]["chat_template_kwargs"] == {"enable_thinking": False} and last.finish_reason
    with pytest.raises(InvalidRequestError) as caught:
        llama.render_chat(chat, None, template_kwargs={"messages": []})
    assert caught.value.param == "chat_template_kwargs"
