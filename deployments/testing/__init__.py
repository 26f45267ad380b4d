"""Helpers for tests and benchmarks: tiny local models and servers. Never imported by the service."""
