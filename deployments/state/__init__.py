"""Stored state: what the service keeps for its callers beyond one request, in one storage root
(`storage`: a local directory by default, any `pyarrow.fs` URI on a cluster), each thing owned by
the API key that made it (`owners`, `records`): files (`files`), batches (`batches`), stored
responses (`responses`) and conversations (`conversations`). docs/architecture.md has the recipe
for a new stored kind.
"""
