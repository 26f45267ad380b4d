"""How the keys' limits count the Batch API (`limits.counting`): creating or cancelling a batch is
not counted; each of its lines is, as the request it makes, against the key that made the batch
(`ingress/batches/lines.py`).
"""

from deployments.ingress.limits.counting import Counted, RouteCounting

COUNTING = (
    RouteCounting("POST", "/v1/batches", Counted.UNCOUNTED),
    RouteCounting("POST", "/v1/batches/{batch_id}/cancel", Counted.UNCOUNTED),
)
