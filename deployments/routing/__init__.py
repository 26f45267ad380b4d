"""Which decoder replica each request goes to: Ray Serve's `RequestRouter` API, set on every decoder
deployment by the builder (`options.routing`, the model's `deployment.routing`; docs/routing.md).

- `keys`: a request's prefix as chained hashes of fixed-size blocks of what the engine reads.
- `index`: `PrefixIndex`, which replicas hold which blocks, as one router has seen it (bounded LRU).
- `choice`: the rule, apart from Ray: the deepest match within a load bound, shared prefixes not
  counted, adapters respected, session hints and load as tie-breakers.
- `router`: `PrefixRouter`, the `RequestRouter` subclass that runs it in each handle's process.
- `held`: `HeldPrefixes`, the replica's own account of what its engine holds, which it reports
  (`record_routing_stats`) to correct the routers' guesses.
- `ray_prefix`: Ray Serve LLM's `PrefixCacheAffinityRouter` made to read our requests, for comparison.

Only `keys` and `held` are imported by the replicas; `router` and `ray_prefix` by the handles' processes.
"""
