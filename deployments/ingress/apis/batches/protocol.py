"""/v1/batches' wire: the create request, OpenAI's batch object and its list."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from deployments.protocol.openai.common import RequestModel

Endpoint = Literal["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"]
ENDPOINTS: tuple[str, ...] = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
Status = Literal["validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"]
TERMINAL: frozenset[str] = frozenset({"failed", "completed", "expired", "cancelled"})
COMPLETION_WINDOW_S = {"24h": 24 * 3600}


class BatchCreateRequest(RequestModel):
    input_file_id: str
    endpoint: Endpoint
    completion_window: Literal["24h"] = "24h"
    metadata: dict[str, str] | None = Field(None, max_length=16)


class BatchError(BaseModel):
    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchError]


class RequestCounts(BaseModel):
    total: int = 0
    completed: int = 0
    failed: int = 0


class BatchUsage(BaseModel):
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
    custom_id: str, request_id: str, status_code: int | None, body: dict[str, Any] | None, error: Any = None
) -> dict[str, Any]:
    """A line of a batch's output or error file, as OpenAI writes it."""
    response = None if status_code is None else {"status_code": status_code, "request_id": request_id, "body": body}
    return {"id": f"batch_req_{request_id}", "custom_id": custom_id, "response": response, "error": error}
