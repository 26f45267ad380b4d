"""/v1/batches' wire: the endpoints a batch may name (`BATCH_ENDPOINTS`), the create request, OpenAI's
batch object and its list, and a line of a batch's output or error file.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from deployments.protocol.openai.chat import ChatCompletionRequest
from deployments.protocol.openai.common import Metadata, RequestModel
from deployments.protocol.openai.completions import CompletionRequest
from deployments.protocol.openai.embeddings import EmbeddingRequest
from deployments.protocol.openai.responses import ResponseRequest


@dataclass(frozen=True)
class BatchEndpoint:
    """An API a batch line may call: its route's `path`, the `request` model that checks a line's body,
    and whether the body names an `embedding` model (else a chat model).
    """

    path: str
    request: type[BaseModel]
    embedding: bool = False


BATCH_ENDPOINTS: dict[str, BatchEndpoint] = {
    endpoint.path: endpoint
    for endpoint in (
        BatchEndpoint("/v1/chat/completions", ChatCompletionRequest),
        BatchEndpoint("/v1/completions", CompletionRequest),
        BatchEndpoint("/v1/embeddings", EmbeddingRequest, embedding=True),
        BatchEndpoint("/v1/responses", ResponseRequest),
    )
}
"""The APIs a batch may name, by path: the one list, which the batch object's `endpoint`, the input
file's check (`batch_runner/validation.py`) and a line's run read. How a line calls each is the
ingress's (`ingress/batches/endpoints.py`, by the same paths)."""

if TYPE_CHECKING:
    Endpoint = str
else:  # one of the paths that `BATCH_ENDPOINTS` lists, as the schema's enum and the 400's words say
    Endpoint = Literal[tuple(BATCH_ENDPOINTS)]
Status = Literal["validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"]
COMPLETION_WINDOW_S = {"24h": 24 * 3600}


class BatchCreateRequest(RequestModel):
    """The create body of /v1/batches: an uploaded input file and the endpoint its lines call."""

    input_file_id: str
    endpoint: Endpoint
    completion_window: Literal["24h"] = "24h"
    metadata: Metadata | None = None

    def new_batch(self) -> dict[str, Any]:
        """The batch this request makes, as the store keeps it: OpenAI's batch object, `validating`."""
        now = int(time.time())
        return Batch(
            id=f"batch_{uuid.uuid4().hex}",
            endpoint=self.endpoint,
            input_file_id=self.input_file_id,
            completion_window=self.completion_window,
            created_at=now,
            expires_at=now + COMPLETION_WINDOW_S[self.completion_window],
            metadata=self.metadata,
        ).model_dump()


class BatchError(BaseModel):
    """Why a line of the input file (or the file itself: no `line`) cannot run."""

    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(BaseModel):
    """The batch's validation errors, as a list object."""

    object: Literal["list"] = "list"
    data: list[BatchError]


class RequestCounts(BaseModel):
    """A batch's lines: in all, answered, failed."""

    total: int = 0
    completed: int = 0
    failed: int = 0


class BatchUsage(BaseModel):
    """The tokens a batch's lines used, in all."""

    input_tokens: int = 0
    input_tokens_details: dict[str, int] = Field(default_factory=lambda: {"cached_tokens": 0})
    output_tokens: int = 0
    output_tokens_details: dict[str, int] = Field(default_factory=lambda: {"reasoning_tokens": 0})
    total_tokens: int = 0


class Batch(BaseModel):
    """OpenAI's batch object."""

    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    model: str | None = None
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: str = "24h"
    status: Status = "validating"
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts = Field(default_factory=RequestCounts)
    usage: BatchUsage = Field(default_factory=BatchUsage)
    metadata: dict[str, str] | None = None


class BatchList(BaseModel):
    """A page of the caller's batches."""

    object: Literal["list"] = "list"
    data: list[Batch]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


EXPIRED_LINE = {
    "code": "batch_expired",
    "message": "This request could not be executed before the completion window expired.",
}
"""The error of a line the completion window's end left unrun, as OpenAI writes it."""


def output_line(
    custom_id: str | None, request_id: str, status_code: int | None, body: dict[str, Any] | None, error: Any = None
) -> dict[str, Any]:
    """A line of a batch's output or error file, as OpenAI writes it (`custom_id` None: a line that could not
    be read has none; its `error` names its `line`).
    """
    response = None if status_code is None else {"status_code": status_code, "request_id": request_id, "body": body}
    return {"id": f"batch_req_{request_id}", "custom_id": custom_id, "response": response, "error": error}
