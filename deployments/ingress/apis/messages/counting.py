"""How the keys' limits count Anthropic's Messages API (`limits.counting`)."""

from deployments.ingress.limits.counting import Budget, Counted, RouteCounting
from deployments.protocol.anthropic import MessagesRequest

COUNTING = (
    RouteCounting("POST", "/v1/messages", Counted.GENERATES, Budget.read(MessagesRequest, "max_tokens")),
    RouteCounting("POST", "/v1/messages/count_tokens", Counted.NAMES_A_MODEL),
)
