"""Helpers for the tests, the benchmarks and the load test, kept out of the shipped package: tiny
models built locally (`tiny_models`), a probe engine for native vision (`native_probe`), and the
load-test and benchmark pieces (`bench`, `faults`, `load_report`, `service_watch`, `answer_check`).
Serve replicas started by the tests import them from the checkout (tests/conftest.py puts it on
PYTHONPATH); scripts put the checkout on sys.path."""
