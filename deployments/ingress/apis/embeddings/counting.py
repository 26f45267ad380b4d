"""How the keys' limits count /v1/embeddings (`limits.counting`): its input is read, nothing is generated."""

from deployments.ingress.limits.counting import Counted, RouteCounting

COUNTING = (RouteCounting("POST", "/v1/embeddings", Counted.READS),)
