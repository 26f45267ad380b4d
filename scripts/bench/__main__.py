"""``python -m scripts.bench SUBCOMMAND [FLAGS]``: runs the subcommand's `main` with the flags after
it. A subcommand's module is imported only when it runs, so that one benchmark never loads
another's libraries (torch, Ray).
"""

from __future__ import annotations

import importlib
import sys

import scripts.bench

SUBCOMMANDS = (
    "serve",
    "overhead",
    "engines",
    "native",
    "ramp",
    "metrics",
    "structured",
    "gpu",
    "embeddings",
    "greedy",
    "burst",
    "prompts",
    "batch",
    "lines",
    "settle",
    "lora",
    "fairness",
    "documents",
    "store",
    "hops",
    "wheel",
    "census",
    "sessions",
)


def main(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in SUBCOMMANDS:
        print(f"usage: python -m scripts.bench {{{','.join(SUBCOMMANDS)}}} [--help | FLAGS]\n")
        print(scripts.bench.__doc__)
        raise SystemExit(0 if argv and argv[0] in ("-h", "--help") else 2)
    importlib.import_module(f"scripts.bench.{argv[0]}").main(argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
