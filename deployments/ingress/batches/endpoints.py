"""The APIs a batch line may call, by path: the one list, which the batch object's `endpoint`
(`apis/batches/protocol.py`), the input file's check (`validation.py`) and a line's run (`lines.py`)
read. Each API declares beside its routes how a line calls it (its `routes.BATCH_LINE`)."""

from __future__ import annotations

from deployments.ingress.apis.chat import routes as chat
from deployments.ingress.apis.completions import routes as completions
from deployments.ingress.apis.embeddings import routes as embeddings
from deployments.ingress.apis.responses import routes as responses
from deployments.ingress.routing import BatchLine

ENDPOINTS: dict[str, BatchLine] = {
    line.path: line for line in (chat.BATCH_LINE, completions.BATCH_LINE, embeddings.BATCH_LINE, responses.BATCH_LINE)
}
