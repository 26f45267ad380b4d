"""How the keys' limits count Anthropic's Messages API (`limits.counting`)."""

from deployments.ingress.limits.counting import Counted, RouteCounting

COUNTING = (
    RouteCounting("POST", "/v1/messages", Counted.GENERATES),
    RouteCounting("POST", "/v1/messages/count_tokens", Counted.NAMES_A_MODEL),
)
