"""/v1/embeddings' wire and request logic without Ray: the request's input forms, the service over
a fake embedder handle (floats and base64 of the same float32 bytes, usage, the per-request input
limit checked before the call, the deadline), and routing between chat and embedding models."""

from __future__ import annotations

import asyncio
import base64
import struct
import time

import pytest
from pydantic import ValidationError

from deployments.errors import InvalidRequestError, ModelNotFoundError, RequestTimeoutError
from deployments.ingress.apis.embeddings.service import EmbeddingService
from deployments.ingress.embedding.core import EmbeddingCore
from deployments.ingress.health import HealthService
from deployments.ingress.served_models import ServedEmbedder, ServedModel, ServedModels
from deployments.monitoring.access_log import RequestRecord
from deployments.protocol.openai.embeddings import EmbeddingRequest
from deployments.protocol.openai.models import ModelCard
from deployments.protocol.replica import ComponentStatus, EmbedRequest, EmbedResult
from tests.unit.ingress.fakes import FakeDecoder, answer_core


class FakeEmbedder:
    """An embedder's handle: each input's vector is [its length, 0.5, -1] in float32; `delay_s` before answering."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.requests: list[EmbedRequest] = []
        self.delay_s = delay_s
        outer = self

        class _Embed:
            def remote(self, request: EmbedRequest):
                outer.requests.append(request)
                return outer._answer(request)

        class _Status:
            def remote(self):
                return outer._status()

        self.embed = _Embed()
        self.status = _Status()
        self.ready: ComponentStatus | Exception = ComponentStatus(ready=True, model="emb")

    async def _status(self) -> ComponentStatus:
        if isinstance(self.ready, Exception):
            raise self.ready
        return self.ready

    async def _answer(self, request: EmbedRequest) -> EmbedResult:
        await asyncio.sleep(self.delay_s)
        vectors = [struct.pack("<3f", float(len(item)), 0.5, -1.0) for item in request.inputs]
        return EmbedResult(vectors=vectors, prompt_tokens=sum(len(item) for item in request.inputs))


def service(embedder: FakeEmbedder, max_inputs: int = 4, timeout_s: float = 5.0) -> EmbeddingService:
    return EmbeddingService(
        EmbeddingCore(embedder, model_name="emb", max_inputs=max_inputs, request_timeout_s=timeout_s)
    )


@pytest.mark.parametrize(
    ("given", "inputs"),
    [
        ("hello", ["hello"]),
        (["a", "b"], ["a", "b"]),
        ([1, 2, 3], [[1, 2, 3]]),
        ([[1], [2, 3]], [[1], [2, 3]]),
    ],
)
def test_every_input_form_becomes_a_list_of_inputs(given, inputs):
    assert EmbeddingRequest(model="m", input=given).inputs == inputs


@pytest.mark.parametrize("given", ["", [], [""], [[]], [1, "a"], [1.5], [-1], [2**40], {"a": 1}, 3, None, [[1], "a"]])
def test_malformed_inputs_are_refused_by_the_schema(given):
    with pytest.raises(ValidationError):
        EmbeddingRequest(model="m", input=given)


def test_unknown_fields_and_formats_are_refused():
    with pytest.raises(ValidationError):
        EmbeddingRequest(model="m", input="x", encoding_format="int8")
    with pytest.raises(ValidationError):
        EmbeddingRequest(model="m", input="x", dimensions=0)
    with pytest.raises(ValidationError):
        EmbeddingRequest(model="m", input="x", truncate=True)


async def test_floats_and_base64_carry_the_replicas_float32_values():
    embedder = FakeEmbedder()
    record = RequestRecord()
    body = await service(embedder).create(EmbeddingRequest(model="emb", input=["ab", "c"]), record)
    assert body["data"] == [
        {"object": "embedding", "index": 0, "embedding": [2.0, 0.5, -1.0]},
        {"object": "embedding", "index": 1, "embedding": [1.0, 0.5, -1.0]},
    ]
    assert body["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    assert (body["object"], body["model"], record.prompt_tokens) == ("list", "emb", 3)
    packed = await service(embedder).create(
        EmbeddingRequest(model="emb", input="ab", encoding_format="base64", dimensions=2), RequestRecord()
    )
    assert struct.unpack("<3f", base64.b64decode(packed["data"][0]["embedding"])) == (2.0, 0.5, -1.0)
    assert embedder.requests[-1].dimensions == 2


async def test_too_many_inputs_are_refused_before_the_replica_is_called():
    embedder = FakeEmbedder()
    with pytest.raises(InvalidRequestError, match="5 inputs; model 'emb' takes at most 4"):
        await service(embedder).create(EmbeddingRequest(model="emb", input=["x"] * 5), RequestRecord())
    assert embedder.requests == []


async def test_a_slow_embedder_is_a_timeout():
    started = time.monotonic()
    with pytest.raises(RequestTimeoutError):
        await service(FakeEmbedder(delay_s=5), timeout_s=0.05).create(
            EmbeddingRequest(model="emb", input="x"), RequestRecord()
        )
    assert time.monotonic() - started < 5


def test_chat_and_embedding_models_are_each_served_by_their_own_endpoint():
    chat = answer_core(FakeDecoder(["hi"]))
    card = ModelCard(id="chat", created=0)
    served = ServedModels(
        [ServedModel(card, chat, HealthService(FakeDecoder(["hi"]), None, model_name="chat"))],
        [ServedEmbedder(ModelCard(id="emb", created=0), service(FakeEmbedder()).core)],
    )
    assert [c.id for c in served.cards.data] == ["chat", "emb"]
    assert served.names == ["chat", "emb"]
    assert served.embedder("emb").core.model == "emb"
    assert served.card("emb").id == "emb"
    with pytest.raises(InvalidRequestError, match="is an embedding model"):
        served.get("emb")
    with pytest.raises(InvalidRequestError, match="is a chat model, not an embedding model"):
        served.embedder("chat")
    with pytest.raises(ModelNotFoundError):
        served.embedder("other")


async def test_health_reports_each_embedder_and_degrades_while_one_is_not_ready():
    embedder = FakeEmbedder()
    chat = answer_core(FakeDecoder(["hi"]))
    served = ServedModels(
        [
            ServedModel(
                ModelCard(id="chat", created=1), chat, HealthService(FakeDecoder(["hi"]), None, model_name="chat")
            )
        ],
        [
            ServedEmbedder(
                ModelCard(id="emb", created=1),
                EmbeddingCore(embedder, model_name="emb", max_inputs=4, request_timeout_s=5),
            )
        ],
    )
    body, code = await served.health()
    assert (body["status"], code) == ("ok", 200) and body["components"]["embedders"]["emb"]["ready"]
    embedder.ready = ComponentStatus(ready=False, model="emb", reason="loading")
    body, code = await served.health()
    assert (body["status"], code) == ("degraded", 200)
    assert body["components"]["embedders"]["emb"]["reason"] == "loading"
    embedder.ready = RuntimeError("replica died")
    body, code = await served.health()
    assert (body["status"], code) == ("degraded", 200) and body["components"]["decoder"]["ready"]
    assert "embedder not reachable: replica died" in body["components"]["embedders"]["emb"]["reason"]
