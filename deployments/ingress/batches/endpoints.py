"""How a batch line calls each API a batch may name (`BATCH_LINES`, by path): each API declares it
beside its routes (its `routes.BATCH_LINE`). Which APIs those are, and the request model that checks
a line's body, is the wire's (`protocol.openai.batches.BATCH_ENDPOINTS`, by the same paths).
"""

from __future__ import annotations

from deployments.ingress.apis.chat import routes as chat
from deployments.ingress.apis.completions import routes as completions
from deployments.ingress.apis.embeddings import routes as embeddings
from deployments.ingress.apis.responses import routes as responses
from deployments.ingress.routing import BatchLine

BATCH_LINES: dict[str, BatchLine] = {
    line.path: line for line in (chat.BATCH_LINE, completions.BATCH_LINE, embeddings.BATCH_LINE, responses.BATCH_LINE)
}
