"""How the keys' limits count each route, as each API declares it (its `apis/<api>/counting.py`,
gathered in `apis/counting.py`): a plain table of methods and route paths, so that the limits never
import a route, and a route that reaches a model or writes state without a declaration fails a unit
test (tests/unit/ingress/limits/test_counting.py) rather than walking around the limits.

| `Counted` | admitted (requests per minute, concurrency) | tokens reserved | model list |
|---|---|---|---|
| `GENERATES` | yes | the prompt's estimate + the completion budget | yes |
| `READS` | yes | the prompt's estimate (an embedding's input) | yes |
| `WRITES` | yes | none (settled at 0) | no model named |
| `NAMES_A_MODEL` | no | none | yes |
| `UNCOUNTED` | no | none | no |

Every admitted request is settled when its response has ended, to the tokens it used."""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass


class Counted(enum.Enum):
    """What the limits do with a route's requests (the table above)."""

    GENERATES = "generates"
    READS = "reads"
    WRITES = "writes"
    NAMES_A_MODEL = "names_a_model"
    UNCOUNTED = "uncounted"

    @property
    def admitted(self) -> bool:
        """Whether the key's buckets admit the request (and settle it when it ends)."""
        return self in (Counted.GENERATES, Counted.READS, Counted.WRITES)

    @property
    def reads_body(self) -> bool:
        """Whether the limits read the request's JSON body (its model, its estimate)."""
        return self in (Counted.GENERATES, Counted.READS, Counted.NAMES_A_MODEL)


@dataclass(frozen=True)
class RouteCounting:
    """One route's declaration: its HTTP `method`, its `path` as the route declares it (FastAPI's
    template, `{name}` for a path parameter) and how it is `counted`."""

    method: str
    path: str
    counted: Counted


class CountingTable:
    """Every API's declarations, looked up by a request's method and path (exact paths first: one
    dict look-up for the model endpoints; a templated path by its pattern)."""

    def __init__(self, declarations: Iterable[RouteCounting]) -> None:
        self.declarations = tuple(declarations)
        self._exact: dict[tuple[str, str], Counted] = {}
        self._patterns: list[tuple[str, re.Pattern[str], Counted]] = []
        seen: set[tuple[str, str]] = set()
        for route in self.declarations:
            if (route.method, route.path) in seen:
                raise ValueError(f"{route.method} {route.path} is declared twice")
            seen.add((route.method, route.path))
            if "{" in route.path:
                self._patterns.append((route.method, _pattern(route.path), route.counted))
            else:
                self._exact[(route.method, route.path)] = route.counted

    def of(self, method: str, path: str) -> Counted | None:
        """How a request of `method` to `path` is counted (None: no declaration)."""
        counted = self._exact.get((method, path))
        if counted is not None:
            return counted
        for declared, pattern, counted in self._patterns:
            if declared == method and pattern.fullmatch(path):
                return counted
        return None

    def declared(self, method: str, path: str) -> bool:
        """Whether a route (`path` as the route declares it) has a declaration."""
        return any((route.method, route.path) == (method, path) for route in self.declarations)


def _pattern(path: str) -> re.Pattern[str]:
    return re.compile(re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(path)))
