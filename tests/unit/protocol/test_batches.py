"""The endpoints a batch may name are a table of the wire (`protocol.openai.batches.BATCH_ENDPOINTS`:
each path, the request model that checks a line's body, chat or embedding model) and one of the
ingress (`ingress.batches.endpoints.BATCH_LINES`: how a line calls the route): both name the same
paths, and each is a POST route of the real app whose body is that request model."""

from __future__ import annotations

from deployments.config import ServerConfig
from deployments.ingress.api import build_api
from deployments.ingress.batches.endpoints import BATCH_LINES
from deployments.ingress.guard import GuardSettings
from deployments.ingress.health import HealthService
from deployments.ingress.served_models import ServedModel, ServedModels
from deployments.protocol.openai.batches import BATCH_ENDPOINTS, BatchCreateRequest
from deployments.protocol.openai.models import ModelCard
from tests.unit.fake_metrics import FakeMetrics
from tests.unit.ingress.fakes import FakeDecoder, answer_core


def test_the_wire_and_the_ingress_name_the_same_paths():
    assert set(BATCH_LINES) == set(BATCH_ENDPOINTS)
    assert [line.path for line in BATCH_LINES.values()] == list(BATCH_LINES)
    assert [endpoint.path for endpoint in BATCH_ENDPOINTS.values()] == list(BATCH_ENDPOINTS)


def test_each_path_is_a_post_route_whose_body_is_the_endpoints_request_model():
    decoder = FakeDecoder()
    core, health = answer_core(decoder, model_name="m"), HealthService(decoder, None, model_name="m")
    served = ServedModels([ServedModel(ModelCard(id="m", created=1), core, health)])
    app = build_api(served, GuardSettings.from_config(ServerConfig(api_keys_env=None)), FakeMetrics())
    bodies = {
        route.path: route.body_field.field_info.annotation
        for route in app.routes
        if "POST" in getattr(route, "methods", ()) and getattr(route, "body_field", None) is not None
    }
    assert {path: bodies.get(path) for path in BATCH_ENDPOINTS} == {
        path: endpoint.request for path, endpoint in BATCH_ENDPOINTS.items()
    }


def test_only_the_embeddings_lines_name_an_embedding_model():
    assert [path for path, endpoint in BATCH_ENDPOINTS.items() if endpoint.embedding] == ["/v1/embeddings"]


def test_a_batch_names_one_of_the_tables_paths():
    assert BatchCreateRequest(input_file_id="file-1", endpoint="/v1/embeddings").endpoint == "/v1/embeddings"
    schema = BatchCreateRequest.model_json_schema()["properties"]["endpoint"]
    assert schema["enum"] == list(BATCH_ENDPOINTS)
