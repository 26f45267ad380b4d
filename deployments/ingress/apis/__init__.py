"""A folder per API (as vLLM keeps `entrypoints/openai/<api>/`): its routes (`routes.py`: its
`attach(api, ...)`, one line in `api.build_api`, and, for an API a batch line may call, how a line
calls it: `BATCH_LINE`), its request logic (`service.py`: a plain class over a served model's
core that only formats the answer's semantic events), and what that API alone needs. Its wire
models are in `deployments/protocol/` (`protocol/openai/<api>.py`, `protocol/anthropic.py`), with
every API's. What two or more share stays outside: the answer core and its events
(`ingress/answer/`), the vision pipeline (`ingress/vision/`), the embedding core
(`ingress/embedding/`), what routes share (`ingress/routing.py`). The recipe for a new API: docs/architecture.md.
"""
