"""Per-key limits (serve_config's `limits_file`, docs/limits.md): who a key is (`table`), what it may
still do, counted once for every ingress replica (`ledger`, held by the application's `board`
actor), what a request may cost (`estimate`), how each route is counted (`counting`: each API declares
it), the headers that tell clients (`headers`), and the middleware that admits, refuses and settles
each request (`limiter`). The decoders' fair share
between keys is their admission's (`engines.admission`), fed by the request's `Tenant`.
"""
