"""How the keys' limits count /v1/completions (`limits.counting`)."""

from deployments.ingress.limits.counting import Counted, RouteCounting

COUNTING = (RouteCounting("POST", "/v1/completions", Counted.GENERATES),)
