"""How the keys' limits count the Responses API (`limits.counting`): a response and a compaction
(a summary of up to 256 tokens over any input) are generated; a deletion writes. Its WebSocket
mode's turns are admitted by its route as `POST /v1/responses` requests.
"""

from deployments.ingress.limits.counting import Budget, Counted, RouteCounting
from deployments.protocol.openai.responses import ResponseRequest

COUNTING = (
    RouteCounting("POST", "/v1/responses", Counted.GENERATES, Budget.read(ResponseRequest, "max_output_tokens")),
    RouteCounting("POST", "/v1/responses/compact", Counted.GENERATES),
    RouteCounting("DELETE", "/v1/responses/{response_id}", Counted.WRITES),
)
