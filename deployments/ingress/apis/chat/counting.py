"""How the keys' limits count /v1/chat/completions (`limits.counting`): `max_completion_tokens`
before `max_tokens`, for each of its `n` choices.
"""

from deployments.ingress.limits.counting import Budget, Counted, RouteCounting
from deployments.protocol.openai.chat import ChatCompletionRequest

COUNTING = (
    RouteCounting(
        "POST",
        "/v1/chat/completions",
        Counted.GENERATES,
        Budget.read(ChatCompletionRequest, "max_completion_tokens", "max_tokens", n=True),
    ),
)
