"""How the keys' limits count the Conversations API (`limits.counting`): each write is a request
(requests per minute, concurrency), with no tokens.
"""

from deployments.ingress.limits.counting import Counted, RouteCounting

COUNTING = (
    RouteCounting("POST", "/v1/conversations", Counted.WRITES),
    RouteCounting("POST", "/v1/conversations/{conversation_id}", Counted.WRITES),
    RouteCounting("DELETE", "/v1/conversations/{conversation_id}", Counted.WRITES),
    RouteCounting("POST", "/v1/conversations/{conversation_id}/items", Counted.WRITES),
    RouteCounting("DELETE", "/v1/conversations/{conversation_id}/items/{item_id}", Counted.WRITES),
)
