"""Ray Serve LLM's `PrefixCacheAffinityRouter` on our decoder, for comparison (`deployment.routing.router:
ray_prefix_cache`; `scripts/bench/sessions.py` measures it beside ours).

As shipped it cannot route our decoder: it reads `messages` as dicts (or strings), and our messages are
`TextMessage` models, so it sees an empty prompt and divides by its length (ZeroDivisionError in
`_prefix_match_best_replicas`). Here it is given the same text our router keys (`keys.serialize`:
the messages' text, image hashes and tools; not the adapter, which it does not key). The rest is
Ray's: a character tree per replica in one detached actor, a match rate of 0.1, power of two past an
imbalance of `imbalanced_threshold`.
"""

from __future__ import annotations

from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import PrefixCacheAffinityRouter
from ray.serve.request_router import PendingRequest

from deployments.protocol.replica import GenerateRequest
from deployments.routing.keys import serialize


class RayPrefixCacheRouter(PrefixCacheAffinityRouter):
    """Ray's router, reading our `GenerateRequest` (a call without one, tokenize, is keyed by a space:
    an empty text would fail it).
    """

    def _extract_text_from_request(self, pending_request: PendingRequest) -> str:
        for arg in (*pending_request.args, *pending_request.kwargs.values()):
            if isinstance(arg, GenerateRequest):
                return serialize(arg) or " "
        return " "
