"""How the keys' limits count /v1/completions (`limits.counting`): its `max_tokens` (16 when unset,
as the legacy API's default) for each of its `n` choices.
"""

from deployments.ingress.limits.counting import Budget, Counted, RouteCounting
from deployments.protocol.openai.completions import CompletionRequest

COUNTING = (
    RouteCounting("POST", "/v1/completions", Counted.GENERATES, Budget.read(CompletionRequest, "max_tokens", n=True)),
)
