"""One batch line run through the same service code as its endpoint's HTTP route (no HTTP hop): what
`Ingress.batch_line` answers the batch runner through its handle. Images, tools, structured output and
embeddings behave as over HTTP; a line's failure is its OpenAI error body and status, as the route
would answer it.
"""

from __future__ import annotations

import logging
from typing import Any

from deployments.errors import ServiceError, to_openai_error
from deployments.ingress.batches.endpoints import BATCH_LINES
from deployments.ingress.limits.limiter import Limiter
from deployments.ingress.limits.table import KeyIdentity
from deployments.ingress.served_models import ServedModels
from deployments.monitoring.access_log import RequestRecord, error_code, log_access
from deployments.protocol.openai.batches import BATCH_ENDPOINTS

logger = logging.getLogger("ray.serve")


async def _answer(served: ServedModels, endpoint: str, body: dict[str, Any], record: RequestRecord) -> Any:
    wire, line = BATCH_ENDPOINTS.get(endpoint), BATCH_LINES.get(endpoint)
    if wire is None or line is None:
        raise ValueError(f"not a batch endpoint: {endpoint}")
    request = wire.request.model_validate(body)
    record.model = getattr(request, "model", None)
    return await line.answer(served, request, record)


async def run_line(
    served: ServedModels,
    batch_id: str,
    endpoint: str,
    body: dict[str, Any],
    request_id: str,
    limits: tuple[Limiter, KeyIdentity] | None = None,
) -> dict[str, Any]:
    """`{"status_code", "body"}` of one line: the endpoint's answer (200), or its error as the route
    would send it. Its access-log line is an HTTP request's, with `batch=<batch id>`. `limits`: the
    limiter and the key that made the batch: the line keeps to the key's models and waits for its
    budget (`Limiter.admit_waiting`), and is settled to the tokens it used.
    """
    record = RequestRecord(request_id=request_id, method="POST", path=endpoint, batch=batch_id)
    admission = None
    try:
        if limits is not None:
            limiter, key = limits
            limiter.check_model(key, body.get("model"))
            record.tenant = key.tenant
            admission = await limiter.admit_waiting(key, endpoint, body)
        answer = await _answer(served, endpoint, body, record)
        record.status = 200
        return {"status_code": 200, "body": answer}
    except Exception as exc:  # every failure is the line's answer, as the route maps it
        status, error, _ = to_openai_error(exc, request_id)
        if status >= 500 and not isinstance(exc, ServiceError):
            logger.exception("batch line %s to %s failed", request_id, endpoint)
        record.status, record.error = status, error_code(error)
        return {"status_code": status, "body": error}
    finally:
        if admission is not None and limits is not None:
            limits[0].settle(admission, record)
        log_access(record)
