"""Helpers for the tests and the load test, kept out of the shipped package: a probe engine for
native vision (`native_probe`), OpenAI's cl100k_base for a client's tiktoken offline
(`tiktoken_cache`), and the load-test pieces (`faults`, `load_report`, `service_watch`,
`answer_check`). The tiny models built locally and the server helpers are the benchmark tool's
(`scripts/bench/`), which the tests import from. Serve replicas started by the tests import them
from the checkout (tests/conftest.py puts it on PYTHONPATH); scripts/loadtest.py puts the checkout
on sys.path."""
