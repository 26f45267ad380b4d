"""Each endpoint's request logic, a module per API family (as vLLM keeps an endpoint's serving logic
apart from its router): `chat` (/v1/chat/completions), `completions` (/v1/completions). A service is
a plain class over a served model's answer core (`answer.core.AnswerCore`) that only frames its
answer; its route in `api.py` hands it the request's body. A new endpoint is a protocol module
(`protocol/openai/`), a service module here and a route."""
