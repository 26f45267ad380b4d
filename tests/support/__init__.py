"""Helpers for the tests, kept out of the shipped package: a probe engine for native vision
(`native_probe`), OpenAI's cl100k_base for a client's tiktoken offline (`tiktoken_cache`), the
agent clients' recorded bodies (`agent_clients`). The tiny models built locally and the server
helpers are the benchmark tool's (`scripts/bench/`), which the tests import from; the load test's
pieces are its own (`scripts/load/`). Scripts never import the tests (tests/unit/test_layout.py
checks). Serve replicas started by the tests import them from the checkout (tests/conftest.py puts
it on PYTHONPATH)."""
