"""The decoder's request router (`request_router_config`), by its model's `deployment.routing`."""

from __future__ import annotations

from typing import Any

from ray.serve.config import RequestRouterConfig

from deployments.config import ModelConfig

PREFIX_ROUTER = "deployments.routing.router.PrefixRouter"
RAY_PREFIX_ROUTER = "deployments.routing.ray_prefix.RayPrefixCacheRouter"
RAY_IMBALANCE = 10  # Ray's PrefixCacheAffinityRouter: its documented example's threshold


def default_imbalance(model: ModelConfig) -> int:
    """A quarter of the replica's sequences, at least 2: a warm replica up to that much busier than the
    least busy still gets the request (its prefix read again elsewhere costs more than the wait).
    """
    return max(2, model.params.max_num_seqs // 4)


def decoder_routing(model: ModelConfig) -> dict[str, Any]:
    """The decoder deployment's `request_router_config` option (none: Serve's power of two choices)."""
    routing = model.deployment.routing
    if routing.router == "power_of_two":
        return {}
    if routing.router == "ray_prefix_cache":
        return router_config(
            request_router_class=RAY_PREFIX_ROUTER,
            request_router_kwargs={"imbalanced_threshold": routing.imbalance or RAY_IMBALANCE},
        )
    kwargs = {
        "model": model.name,
        "imbalance": default_imbalance(model) if routing.imbalance is None else routing.imbalance,
        "index_blocks": routing.index_blocks,
    }
    return router_config(
        request_router_class=PREFIX_ROUTER,
        request_router_kwargs=kwargs,
        request_routing_stats_period_s=routing.stats_period_s,
    )


def router_config(**fields: Any) -> dict[str, Any]:
    """Serve's option (its `RequestRouterConfig.__init__` is annotated as taking dicts alone)."""
    return {"request_router_config": RequestRouterConfig(**fields)}
