import pickle

import pytest
from pydantic import BaseModel, ValidationError

from deployments.errors import (
    CaptionerUnavailable,
    ContextLengthError,
    InvalidImageError,
    ModelNotFoundError,
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
