"""Per-request constraints and prompts in the transformers engines: logprobs, logit_bias, JSON grammars
(on the tiny model in every engine, and on the real SmolLM2 GGUF in a continuous batch), legacy
completion prompts (tools: test_tool_rendering.py)."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from deployments.config import EngineParams, ModelConfig
from deployments.engines import TextEngine, create_text_engine
from deployments.engines.transformers import int4_cpu
from deployments.engines.transformers.constraints import TokenTexts, _bytes_to_unicode
from deployments.engines.transformers.continuous import ContinuousBatchingTextEngine
from deployments.errors import ContextLengthError, InvalidRequestError
from deployments.protocol.replica import GenerateRequest, GrammarSpec, TextMessage

NEEDS_INT4 = pytest.mark.skipif(not int4_cpu.available(), reason="this torch has no CPU int4 kernel")

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def ask(text: str, **kw) -> GenerateRequest:
    return GenerateRequest(messages=[TextMessage(role="user", content=text)], **kw)


async def complete(engine: TextEngine, request: GenerateRequest):
    pieces = [p async for p in engine.generate(request)]
    return "".join(p.text for p in pieces), pieces


def entries(pieces):
    return [entry for piece in pieces for entry in piece.logprobs]


def token_id(tokenizer, entry) -> int:
    """The id of a logprob entry's token, from its bytes (SmolLM2's vocabulary is byte-level)."""
    alphabet = _bytes_to_unicode()
    return tokenizer.convert_tokens_to_ids("".join(alphabet[b] for b in entry.bytes))


@pytest.fixture(
    scope="module",
    params=["continuous", "static", "sequential", pytest.param("continuous+int4-cpu", marks=NEEDS_INT4)],
)
def tiny_llm(request, tiny_llm_dir) -> TextEngine:
    batching, _, quantization = request.param.partition("+")
    params = EngineParams(batching=batching, quantization=quantization or "none", max_num_seqs=4)
    engine = create_text_engine(ModelConfig(name="tiny", local_path=str(tiny_llm_dir), params=params))
    yield engine
    engine.close()


def float32_only(engine: TextEngine) -> None:
    if engine.params.quantization == "int4-cpu":
        pytest.skip("int4-cpu logits are bfloat16 approximations: compared in float32 only")


# --------------------------------------------------------------------------- logprobs


async def test_logprobs_give_one_entry_per_token_aligned_with_the_text(tiny_llm):
    """Each piece carries the entries of the tokens whose text it carries: their bytes add up to the
    text (the random model emits tokens that are parts of multi-byte characters), and there is one
    entry per generated token. Under greedy the chosen token is the most likely: `top_logprobs[0]`."""
    text, pieces = await complete(tiny_llm, ask("hello there", temperature=0, max_tokens=24, logprobs=5))
    got = entries(pieces)
    assert len(got) == pieces[-1].completion_tokens > 0
    special = set(tiny_llm.tokenizer.all_special_tokens)
    raw = b"".join(bytes(e.bytes) for e in got if e.token not in special)
    assert raw.decode(errors="replace") == text
    for entry in got:
        assert len(entry.top_logprobs) == 5
        values = [t.logprob for t in entry.top_logprobs]
        assert values == sorted(values, reverse=True)
        assert (entry.top_logprobs[0].token, entry.top_logprobs[0].logprob) == (entry.token, entry.logprob)
        assert entry.top_logprobs[0].bytes == entry.bytes
    for piece in pieces[:-1]:  # a piece's entries are its own tokens; text is only sent when whole
        assert piece.logprobs


async def test_logprobs_zero_gives_the_chosen_token_only_and_none_gives_nothing(tiny_llm):
    _, pieces = await complete(tiny_llm, ask("hi", temperature=0, max_tokens=6, logprobs=0))
    got = entries(pieces)
    assert len(got) == pieces[-1].completion_tokens and all(e.top_logprobs == [] for e in got)
    _, pieces = await complete(tiny_llm, ask("hi", temperature=0, max_tokens=6))
    assert entries(pieces) == []


@pytest.fixture(scope="module")
def reference(tiny_llm_dir):
    """The tiny model loaded on its own (plain sdpa attention): the distribution to compare with."""
    return AutoModelForCausalLM.from_pretrained(tiny_llm_dir).eval()


def first_token_logprobs(model, prompt: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([prompt])).logits[0, -1].float().log_softmax(-1)


@pytest.mark.parametrize("temperature", [0, 1.5])
async def test_logprobs_are_the_models_raw_distribution(tiny_llm, reference, temperature):
    """The first token's logprob and alternatives are those of a direct forward pass on the prompt,
    before temperature (sampled at 1.5, they are still the raw distribution's)."""
    float32_only(tiny_llm)
    request = ask("what comes next", temperature=temperature, max_tokens=3, logprobs=4)
    expected = first_token_logprobs(reference, tiny_llm.chat_ids(request.messages, request.tools))
    _, pieces = await complete(tiny_llm, request)
    first = entries(pieces)[0]
    values, ids = expected.topk(4)
    assert [t.logprob for t in first.top_logprobs] == pytest.approx(values.tolist(), abs=1e-4)
    assert [token_id(tiny_llm.tokenizer, t) for t in first.top_logprobs] == ids.tolist()
    assert first.logprob == pytest.approx(expected[token_id(tiny_llm.tokenizer, first)].item(), abs=1e-4)


def test_token_bytes_are_the_raw_bytes_of_partial_characters(tiny_llm_dir):
    """A byte-level token that is part of a multi-byte character decodes to U+FFFD, but its bytes are
    exact, so that clients can join them."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_llm_dir)
    texts = TokenTexts(tokenizer)
    ids = tokenizer("☃ é 日本").input_ids
    assert b"".join(bytes(texts.entry(i)[1]) for i in ids) == "☃ é 日本".encode()
    assert any(texts.entry(i)[0].endswith("\ufffd") for i in ids)
    assert texts.entry(tokenizer.eos_token_id) == (tokenizer.eos_token, list(tokenizer.eos_token.encode()))


# --------------------------------------------------------------------------- logit_bias


async def test_logit_bias_forces_and_bans_tokens(tiny_llm):
    banana = tiny_llm.tokenizer.convert_tokens_to_ids("Ġbanana")
    text, pieces = await complete(
        tiny_llm, ask("hello there", temperature=0, max_tokens=4, logit_bias={banana: 100}, logprobs=2)
    )
    assert text == " banana" * 4
    # logprobs stay the model's: before the bias, the forced token is not among the most likely
    first = entries(pieces)[0]
    assert first.token == " banana" and first.logprob < first.top_logprobs[-1].logprob
    _, pieces = await complete(tiny_llm, ask("hello there", temperature=0, max_tokens=1, logprobs=0))
    greedy = token_id(tiny_llm.tokenizer, entries(pieces)[0])
    _, banned = await complete(
        tiny_llm, ask("hello there", temperature=0, max_tokens=1, logprobs=0, logit_bias={greedy: -100})
    )
    assert entries(banned)[0].token != entries(pieces)[0].token


async def test_logit_bias_applies_when_sampling(tiny_llm):
    banana = tiny_llm.tokenizer.convert_tokens_to_ids("Ġbanana")
    text, _ = await complete(tiny_llm, ask("hi", temperature=1.2, top_p=0.9, max_tokens=3, logit_bias={banana: 100}))
    assert text == " banana" * 3


async def test_logit_bias_outside_the_vocabulary_is_a_400(tiny_llm):
    with pytest.raises(InvalidRequestError) as err:
        await complete(tiny_llm, ask("hi", logit_bias={len(tiny_llm.tokenizer) + 5: 1.0}))
    assert err.value.param == "logit_bias"


# --------------------------------------------------------------------------- grammar (every engine)


@pytest.mark.parametrize("temperature", [0, 1.0])
async def test_a_grammar_ends_the_sequence_at_its_end(tiny_llm, temperature):
    """The random model never stops on its own; under a grammar it writes a valid document and the
    grammar's end forces EOS."""
    _, free = await complete(tiny_llm, ask("hello there", temperature=0, max_tokens=30))
    assert free[-1].finish_reason == "length"
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    for spec, check in (
        (GrammarSpec(kind="json_schema", json_schema='{"enum": ["yes", "no"]}'), lambda v: v in ("yes", "no")),
        (GrammarSpec(kind="json_schema", json_schema=json.dumps(schema)), lambda v: isinstance(v["ok"], bool)),
    ):
        text, pieces = await complete(
            tiny_llm, ask("hello there", temperature=temperature, max_tokens=60, grammar=spec)
        )
        assert pieces[-1].finish_reason == "stop", text
        assert check(json.loads(text))


async def test_invalid_schemas_are_400s_with_the_librarys_message(tiny_llm):
    for schema, message in (('{"type": "objekt"}', "objekt"), ("{not json", "not valid JSON"), ("[1, 2]", "object")):
        with pytest.raises(InvalidRequestError, match=message) as err:
            await complete(tiny_llm, ask("hi", grammar=GrammarSpec(kind="json_schema", json_schema=schema)))
        assert err.value.param == "response_format"


# --------------------------------------------------------------------------- prompts


async def test_a_text_prompt_is_used_without_the_chat_template(tiny_llm):
    request = GenerateRequest(prompt="Once upon a time", temperature=0, max_tokens=6)
    ids = (await tiny_llm.prepare(request)).prompt
    assert ids == tiny_llm.tokenizer("Once upon a time").input_ids  # SmolLM2's tokenizer adds no BOS
    assert "<|im_start|>" not in tiny_llm.tokenizer.decode(ids)
    text, pieces = await complete(tiny_llm, request)
    assert pieces[-1].prompt_tokens == len(ids)
    same, _ = await complete(tiny_llm, GenerateRequest(prompt=ids, temperature=0, max_tokens=6))
    assert same == text


async def test_prompt_token_ids_are_checked(tiny_llm):
    for prompt in ([1, 2, len(tiny_llm.tokenizer)], [-1], []):
        with pytest.raises(InvalidRequestError) as err:
            await complete(tiny_llm, GenerateRequest(prompt=prompt, max_tokens=2))
        assert err.value.param == "prompt"
    with pytest.raises(ContextLengthError) as err:
        await complete(tiny_llm, GenerateRequest(prompt=[5] * 600, max_tokens=2))
    assert err.value.param == "prompt"


# --------------------------------------------------------------------------- a continuous batch, mixed


async def test_constraints_apply_only_to_new_tokens_while_prompts_are_prefilled_in_chunks(tiny_llm_dir):
    """With 32-token steps, 300-token prompts are prefilled over many steps in which they have no new
    token (the manager still hands the sampler a row for them, read from position 0). A constrained
    long request gets no logprob entry and no grammar step from those rows, a biased short request
    next to a long one gets the bias on its own row only, and an unconstrained long request answers
    as it does alone."""
    params = EngineParams(max_num_seqs=4, prefill_chunk_size=32)
    engine = create_text_engine(ModelConfig(name="tiny", local_path=str(tiny_llm_dir), params=params))
    try:
        assert isinstance(engine, ContinuousBatchingTextEngine)
        story = "a long story about items " * 50
        spec = GrammarSpec(kind="json_schema", json_schema='{"enum": ["yes", "no"]}')
        answer, pieces = await complete(engine, ask(story, temperature=0, max_tokens=20, logprobs=1, grammar=spec))
        assert json.loads(answer) in ("yes", "no") and pieces[-1].finish_reason == "stop"
        assert "".join(e.token for e in entries(pieces)) == answer + engine.tokenizer.eos_token

        banana = engine.tokenizer.convert_tokens_to_ids("Ġbanana")
        free = ask(story, temperature=0, max_tokens=8)
        alone, _ = await complete(engine, free)
        biased = ask("hi", temperature=0, max_tokens=30, logit_bias={banana: 100}, logprobs=1)
        (together, _), (forced, biased_pieces) = await asyncio.gather(complete(engine, free), complete(engine, biased))
        assert together == alone and " banana" not in alone
        assert forced == " banana" * 30 and len(entries(biased_pieces)) == 30
    finally:
        engine.close()


@pytest.fixture(scope="module")
def smollm2_engine(smollm2) -> TextEngine:
    """The real offline default in float32 (batch-invariant: a sequence's answer does not depend on
    its neighbours)."""
    model = ModelConfig(
        name="smollm2",
        engine="transformers",
        local_path=str(smollm2.parent),
        weight_file=smollm2.name,
        # KV room for 2 x 2048 tokens: the default 8 x 8192 float32 tokens (3 GB) is more than transformers'
        # continuous batching finds on a machine whose NUMA node is small (it counts that node's memory only)
        params={"max_num_seqs": 2, "max_model_len": 2048},
    )
    engine = create_text_engine(model)
    yield engine
    engine.close()


async def test_json_schema_output_parses_and_validates_on_the_real_model(smollm2_engine):
    spec = GrammarSpec(kind="json_schema", json_schema=json.dumps(PERSON))
    question = "Who is the president of France? Answer in JSON."
    text, pieces = await complete(smollm2_engine, ask(question, temperature=0, max_tokens=100, grammar=spec))
    assert pieces[-1].finish_reason == "stop"
    jsonschema.validate(json.loads(text), PERSON)
    free, _ = await complete(smollm2_engine, ask(question, temperature=0, max_tokens=30))
    assert not free.startswith("{")  # the grammar made the difference


async def test_json_object_output_parses_on_the_real_model(smollm2_engine):
    spec = GrammarSpec(kind="json_object")
    question = "Who is the president of France? Answer in JSON."
    text, pieces = await complete(smollm2_engine, ask(question, temperature=0, max_tokens=100, grammar=spec))
    assert pieces[-1].finish_reason == "stop"
    assert isinstance(json.loads(text), dict)


async def test_constrained_and_free_requests_share_a_batch(smollm2_engine):
    """Greedy and sampled requests under a schema run in the same steps as unconstrained ones, which
    answer exactly as they do alone."""
    free = [ask(f"What is the capital of {c}?", temperature=0, max_tokens=24) for c in ("France", "Japan")]
    alone = [(await complete(smollm2_engine, r))[0] for r in free]
    spec = GrammarSpec(kind="json_schema", json_schema=json.dumps(PERSON))
    constrained = [
        ask("Who is the president of France? Answer in JSON.", temperature=0, max_tokens=100, grammar=spec),
        ask("Describe a person as JSON.", temperature=0.8, max_tokens=120, grammar=spec, logprobs=2),
    ]
    results = await asyncio.gather(*(complete(smollm2_engine, r) for r in [*free, *constrained]))
    assert [text for text, _ in results[:2]] == alone
    for text, pieces in results[2:]:
        if pieces[-1].finish_reason == "stop":  # a sampled answer may run out of tokens mid-document
            jsonschema.validate(json.loads(text), PERSON)
        else:
            assert text.startswith("{")
    assert results[2][1][-1].finish_reason == "stop"
    assert len(entries(results[3][1])) == results[3][1][-1].completion_tokens


@pytest.mark.parametrize(
    ("question", "schema"),
    [
        ("Who is the president of France? Answer in JSON.", PERSON),
        ("Describe a cat in JSON, with a long description.", {"type": "object"}),
    ],
)
async def test_the_grammar_only_replaces_tokens_it_forbids(smollm2_engine, question, schema):
    """The grammar never adds to a loop: replayed against a fresh matcher, each greedy token of a
    constrained answer is the model's own most likely token (the raw logprobs' first) unless the
    grammar forbids that one at that point. A constrained answer that loops until max_tokens loops on
    tokens the model chose itself."""
    spec = GrammarSpec(kind="json_schema", json_schema=json.dumps(schema))
    _, pieces = await complete(smollm2_engine, ask(question, temperature=0, max_tokens=80, grammar=spec, logprobs=1))
    grammar = smollm2_engine.grammars.compile(spec)
    tokenizer, vocab = smollm2_engine.tokenizer, smollm2_engine.grammars._vocab_size
    replaced = 0
    for entry in entries(pieces):
        chosen, favourite = token_id(tokenizer, entry), token_id(tokenizer, entry.top_logprobs[0])
        if chosen != favourite:
            bitmask = np.zeros((1, (vocab + 31) // 32), dtype=np.int32)
            grammar.fill_mask(bitmask, 0)
            allowed = bool((bitmask[0, favourite // 32] >> (favourite % 32)) & 1)
            assert not allowed, f"the grammar replaced an allowed token: {entry.top_logprobs[0].token!r}"
            replaced += 1
        grammar.accept(chosen)
    assert len(entries(pieces)) == pieces[-1].completion_tokens and replaced < len(entries(pieces))


async def test_a_compact_grammar_allows_at_most_a_space_between_tokens(tiny_llm):
    """Tool calls are compact: the tiny model's random weights otherwise fill gaps with whitespace."""
    schema = {"type": "array", "items": {"type": "object", "properties": {"x": {"enum": ["a", "b"]}}}, "maxItems": 2}
    spec = GrammarSpec(kind="json_schema", json_schema=json.dumps(schema), compact=True)
    text, pieces = await complete(tiny_llm, ask("hi", temperature=0, max_tokens=60, grammar=spec))
    assert pieces[-1].finish_reason == "stop" and isinstance(json.loads(text), list)
    assert not any(c in text for c in "\n\r\t") and "  " not in text
