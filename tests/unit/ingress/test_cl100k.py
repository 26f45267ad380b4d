"""`embedding.token_ids: cl100k_base`: OpenAI's cl100k_base ids, as LangChain's OpenAIEmbeddings sends
them (tiktoken's own `cl100k_base`, read from a local cache as a client would have it), become the
text they encode before the embedder is called; an id cl100k_base lacks is a 400 naming `input` and
the embedder is never called; the default `model` passes ids on untouched."""

from __future__ import annotations

import pytest
import tiktoken
from pydantic import ValidationError

from deployments.config import EmbeddingConfig
from deployments.errors import InvalidRequestError
from deployments.ingress.apis.embeddings.service import EmbeddingService
from deployments.ingress.embedding import cl100k
from deployments.ingress.embedding.core import EmbeddingCore
from deployments.monitoring.access_log import RequestRecord
from deployments.protocol.openai.embeddings import EmbeddingRequest
from tests.support.tiktoken_cache import cl100k_cache
from tests.unit.ingress.test_embeddings import FakeEmbedder

TEXTS = [
    "The cat sleeps on the sofa.",
    "Ray Serve composes deployments; LangChain sends token ids by default.",
    "Ünïcödé, 日本語のテキスト, emoji 🐍 and\nnew lines\ttabs.",
]


@pytest.fixture(scope="module")
def openai_encoding(tmp_path_factory) -> tiktoken.Encoding:
    """tiktoken's own cl100k_base (the constructor LangChain reaches, with its sha256 check), from a cache."""
    from tiktoken_ext.openai_public import cl100k_base

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIKTOKEN_CACHE_DIR", str(cl100k_cache(tmp_path_factory.mktemp("tiktoken"))))
        return tiktoken.Encoding(**cl100k_base())


def core(embedder: FakeEmbedder, token_ids: str) -> EmbeddingCore:
    return EmbeddingCore(
        embedder,
        model_name="emb",
        max_inputs=8,
        request_timeout_s=5,
        token_ids=token_ids,  # type: ignore[arg-type]
    )


def test_the_bundled_encoding_is_openais_cl100k_base(openai_encoding):
    ours = cl100k.encoding()
    assert ours is cl100k.encoding()  # loaded once
    assert ours.n_vocab == openai_encoding.n_vocab == 100277
    assert ours._pat_str == openai_encoding._pat_str
    assert ours._special_tokens == openai_encoding._special_tokens
    assert all(ours.encode(text) == openai_encoding.encode(text) for text in TEXTS)


def test_ids_decode_to_the_text_they_encode(openai_encoding):
    ids = [openai_encoding.encode_ordinary(text) for text in TEXTS]
    assert cl100k.decode(ids) == TEXTS
    assert cl100k.decode([[100257], [100276, 9906]]) == ["<|endoftext|>", "<|endofprompt|>Hello"]


@pytest.mark.parametrize("forms", ["one list", "lists"])
async def test_the_embedder_gets_the_text_and_counts_its_own_tokens(openai_encoding, forms):
    embedder = FakeEmbedder()
    ids = [openai_encoding.encode_ordinary(text) for text in TEXTS]
    given = ids[0] if forms == "one list" else ids
    record = RequestRecord()
    body = await EmbeddingService(core(embedder, "cl100k_base")).create(
        EmbeddingRequest(model="emb", input=given), record
    )
    sent = TEXTS[:1] if forms == "one list" else TEXTS
    assert embedder.requests[-1].inputs == sent
    assert [d["embedding"][0] for d in body["data"]] == [
        float(len(t)) for t in sent
    ]  # the fake's vector: its input's length
    assert body["usage"]["prompt_tokens"] == sum(len(t) for t in sent)  # the replica's count, not the client's ids


async def test_texts_are_untouched_and_the_default_reads_the_models_own_ids():
    embedder = FakeEmbedder()
    await core(embedder, "cl100k_base").embed(["plain text"], None)
    assert embedder.requests[-1].inputs == ["plain text"]
    await core(embedder, "model").embed([[101, 50000, 102]], None)
    assert embedder.requests[-1].inputs == [[101, 50000, 102]]
    assert EmbeddingConfig().token_ids == "model"


@pytest.mark.parametrize("bad", [100256, 100261, 100275, 100277, 2**31 - 1])
async def test_an_id_cl100k_base_lacks_is_a_400_naming_input(bad):
    embedder = FakeEmbedder()
    with pytest.raises(
        InvalidRequestError, match=f"input\\[1\\] has token id {bad}, which is not a cl100k_base"
    ) as err:
        await core(embedder, "cl100k_base").embed([[9906], [9906, bad, 1917]], None)
    assert err.value.param == "input"
    assert embedder.requests == []


def test_the_setting_takes_only_known_vocabularies():
    assert EmbeddingConfig(token_ids="cl100k_base").token_ids == "cl100k_base"
    with pytest.raises(ValidationError):
        EmbeddingConfig(token_ids="o200k_base")  # type: ignore[arg-type]
