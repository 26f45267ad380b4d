import pickle

import pytest
from pydantic import BaseModel, ValidationError
from ray.exceptions import ActorDiedError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

from deployments.errors import (
    AuthenticationError,
    CaptionerUnavailable,
    ContextLengthError,
    InvalidImageError,
    ModelNotFoundError,
    PayloadTooLargeError,
    RequestTimeoutError,
    to_openai_error,
)


def test_service_errors_map_to_their_status_and_fields():
    status, body, headers = to_openai_error(ModelNotFoundError("no such model", param="model"), "rid")
    assert status == 404
    assert body == {
        "error": {
            "message": "no such model",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }
    assert headers == {}
    status, body, _ = to_openai_error(ContextLengthError("too long", param="messages"), "rid")
    assert (status, body["error"]["code"]) == (400, "context_length_exceeded")


def test_unavailable_sets_retry_after():
    status, body, headers = to_openai_error(CaptionerUnavailable("down"), "rid")
    assert status == 503 and headers["Retry-After"].isdigit()
    assert body["error"]["type"] == "service_unavailable"


def test_validation_error_is_400_with_param():
    class M(BaseModel):
        temperature: float

    with pytest.raises(ValidationError) as err:
        M.model_validate({"temperature": "hot"})
    status, body, _ = to_openai_error(err.value, "rid")
    assert status == 400 and body["error"]["param"] == "temperature"


def test_bugs_are_generic_500_naming_the_request_id():
    status, body, _ = to_openai_error(KeyError("secret internal detail"), "req-42")
    assert status == 500
    assert "req-42" in body["error"]["message"]
    assert "secret" not in body["error"]["message"]


def test_errors_survive_pickling_across_handles():
    err = pickle.loads(pickle.dumps(InvalidImageError("bad", param="messages[0].content[1].image_url")))
    assert isinstance(err, InvalidImageError) and err.param == "messages[0].content[1].image_url"


def test_wrapped_cause_is_unwrapped():
    class RayTaskErrorLike(Exception):
        def __init__(self, cause):
            super().__init__("wrapped")
            self.cause = cause

    status, _, _ = to_openai_error(RayTaskErrorLike(ContextLengthError("long")), "rid")
    assert status == 400


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (AuthenticationError("bad key"), 401, "invalid_api_key"),
        (RequestTimeoutError("too slow"), 408, "request_timeout"),
        (PayloadTooLargeError("too big"), 413, "request_too_large"),
    ],
)
def test_access_and_limit_errors(error, status, code):
    got, body, headers = to_openai_error(error, "rid")
    assert (got, body["error"]["code"], body["error"]["message"], headers) == (status, code, error.message, {})


def test_serve_back_pressure_is_503_overloaded_with_its_retry_after():
    status, body, headers = to_openai_error(BackPressureError(5, 4, retry_after_s=2.5), "rid")
    assert (status, body["error"]["code"], headers) == (503, "overloaded", {"Retry-After": "3"})
    _, _, headers = to_openai_error(BackPressureError(5, 4), "rid")
    assert headers == {"Retry-After": "1"}


@pytest.mark.parametrize("exc", [ActorDiedError(), DeploymentUnavailableError("PrimaryDecoder")])
def test_dead_or_missing_replicas_are_503_not_500(exc):
    status, body, headers = to_openai_error(exc, "rid")
    assert (status, body["error"]["type"]) == (503, "service_unavailable")
    assert "Retry-After" in headers
