"""The engine on a GPU (not written yet: issue 36): the transformers engine alone on a real-shape
random model, against plain `generate` and the memory-bandwidth roofline, one JSON line per
configuration.

`main` is the slot the benchmark plugs into: it takes the flags after ``gpu`` and, like every
subcommand, prints its results with `common.emit`."""

from __future__ import annotations

from scripts.bench.common import arguments


def main(argv: list[str] | None = None) -> None:
    arguments("gpu", __doc__).parse_args(argv)
    raise SystemExit("python -m scripts.bench gpu: not written yet (issue 36)")
