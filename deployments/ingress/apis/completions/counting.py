"""How the keys' limits count /v1/completions (`limits.counting`): its `max_tokens` (16 when unset,
as the legacy API's default) for each of its `n` choices."""

from deployments.ingress.apis.completions.protocol import CompletionRequest
from deployments.ingress.limits.counting import Budget, Counted, RouteCounting

COUNTING = (
    RouteCounting("POST", "/v1/completions", Counted.GENERATES, Budget.read(CompletionRequest, "max_tokens", n=True)),
)
