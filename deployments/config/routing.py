"""How a decoder's requests are spread over its replicas (``deployment.routing`` of a models.yaml entry)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from deployments.config.strict import StrictModel

RouterName = Literal["prefix", "power_of_two", "ray_prefix_cache"]


class RoutingConfig(StrictModel):
    """The decoder's request router (docs/routing.md). Only a decoder with more than one replica has a
    choice to make; with one, every router sends everything to it.
    """

    router: RouterName = Field(
        "prefix",
        description="prefix: ours (deployments/routing/): each request to the replica that holds the longest "
        "part of its prompt (messages, image hashes, tools, adapter), bounded by load, with the client's session "
        "hints as tie-breakers. power_of_two: Serve's default (the less busy of two replicas at random). "
        "ray_prefix_cache: Ray Serve LLM's PrefixCacheAffinityRouter with our prompt given to it (for comparison; "
        "it keys the messages' text alone).",
    )
    imbalance: int | None = Field(
        None,
        ge=0,
        description="prefix: how many more ongoing requests than the least busy replica a replica holding the "
        "prompt's prefix may have and still get it; beyond that the least busy gets it. Default: a quarter of "
        "max_num_seqs, at least 2. ray_prefix_cache: its imbalanced_threshold (default 10, Ray's example).",
    )
    stats_period_s: float = Field(
        2.0,
        gt=0,
        description="prefix: how often each replica reports the prefixes it holds (Serve's "
        "request_routing_stats_period_s); between reports a router relies on where it sent each prefix.",
    )
    index_blocks: int = Field(
        65_536,
        gt=0,
        description="prefix: the most prefix blocks (256 characters each) one router remembers, least recently "
        "used first forgotten (about 150 bytes each).",
    )
