"""How the keys' limits count each route, as each API declares it (its `apis/<api>/counting.py`,
gathered in `apis/counting.py`, which the builder hands to the `Limiter`): a plain table of methods
and route paths, so that the limits never import an API, and a route that reaches a model or writes
state without a declaration fails a unit test (tests/unit/ingress/limits/test_counting.py) rather
than walking around the limits. A route that generates also declares how its API reads a request's
completion budget (`Budget`: its own request model's fields, so that the limits read them as the API
does without importing it).

| `Counted` | admitted (requests per minute, concurrency) | tokens reserved | model list |
|---|---|---|---|
| `GENERATES` | yes | the prompt's estimate + the completion budget | yes |
| `READS` | yes | the prompt's estimate (an embedding's input) | yes |
| `WRITES` | yes | none (settled at 0) | no model named |
| `NAMES_A_MODEL` | no | none | yes |
| `UNCOUNTED` | no | none | no |

Every admitted request is settled when its response has ended, to the tokens it used.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, create_model


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
class Budget:
    """How an API reads a request's completion budget: `fields`, a model of the request fields the
    budget reads with the API's own types, bounds and defaults (its coercion: `"400"` and `400.0` are
    400 there and here; legacy completions' default of 16), and `names`, the max-tokens fields in
    precedence (the first one set wins); an `n` field, where `fields` has one, is the choices.
    """

    fields: type[BaseModel]
    names: tuple[str, ...]

    @classmethod
    def read(cls, request: type[BaseModel], *names: str, n: bool = False, like: str | None = None) -> Budget:
        """The budget of `request` (an API's request model) read from its fields `names` (and `n`);
        a name that `request` lacks is read as its field `like`.
        """
        fields: dict[str, Any] = {}
        for name in (*names, "n") if n else names:
            info = request.model_fields[name if name in request.model_fields or like is None else like]
            fields[name] = (info.annotation, info)
        model = create_model(f"{request.__name__}Budget", __config__=ConfigDict(extra="ignore"), **fields)
        return cls(model, names)


@dataclass(frozen=True)
class RouteCounting:
    """One route's declaration: its HTTP `method`, its `path` as the route declares it (FastAPI's
    template, `{name}` for a path parameter), how it is `counted`, and for a route that generates,
    how its API reads the completion `budget` (None: any of the usual names, as chat reads them).
    """

    method: str
    path: str
    counted: Counted
    budget: Budget | None = None


class CountingTable:
    """Every API's declarations, looked up by a request's method and path (exact paths first: one
    dict look-up for the model endpoints; a templated path by its pattern).
    """

    def __init__(self, declarations: Iterable[RouteCounting]) -> None:
        self.declarations = tuple(declarations)
        self._exact: dict[tuple[str, str], RouteCounting] = {}
        self._patterns: list[tuple[re.Pattern[str], RouteCounting]] = []
        seen: set[tuple[str, str]] = set()
        for route in self.declarations:
            if (route.method, route.path) in seen:
                raise ValueError(f"{route.method} {route.path} is declared twice")
            seen.add((route.method, route.path))
            if "{" in route.path:
                self._patterns.append((_pattern(route.path), route))
            else:
                self._exact[(route.method, route.path)] = route

    def route(self, method: str, path: str) -> RouteCounting | None:
        """The declaration that a request of `method` to `path` falls under (None: none)."""
        route = self._exact.get((method, path))
        if route is not None:
            return route
        for pattern, route in self._patterns:
            if route.method == method and pattern.fullmatch(path):
                return route
        return None

    def of(self, method: str, path: str) -> Counted | None:
        """How a request of `method` to `path` is counted (None: no declaration)."""
        route = self.route(method, path)
        return route.counted if route is not None else None

    def declared(self, method: str, path: str) -> bool:
        """Whether a route (`path` as the route declares it) has a declaration."""
        return any((route.method, route.path) == (method, path) for route in self.declarations)


def _pattern(path: str) -> re.Pattern[str]:
    return re.compile(re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(path)))
