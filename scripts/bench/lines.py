"""Reading a batch input file's lines (`input_lines.lines`, the runner's and the validator's reader) against
the reader it replaced (kept here as the baseline: `pending += chunk`, then split the whole pending
bytes, on every chunk: quadratic in a line's length), on the same files in one run.

The files:

1. one long line (`--line-mb`, 32 by default: `server.max_body_bytes`, the cap of a batch line);
2. many short lines (`--short-lines` lines of about 160 bytes, as many bytes in all).

Each reader runs `--repeats` times per file on a local storage root (the page cache warm after the
first), median wall time; the new reader with and without its cap (`server.max_body_bytes`).

    .venv/bin/python -m scripts.bench lines
    .venv/bin/python -m scripts.bench lines --line-mb 16 --repeats 1  # a smoke run

Prints one JSON line per file and reader.
"""

from __future__ import annotations

import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from deployments.batch_runner.input_lines import lines
from deployments.config import ServerConfig
from deployments.state.storage import LocalStorage, Storage
from scripts.bench.common import arguments, emit

CAP: int = ServerConfig.model_fields["max_body_bytes"].default


def quadratic_lines(storage: Storage, path: str) -> Iterator[tuple[int, bytes]]:
    """The reader before 2026-11-28, the baseline."""
    pending = b""
    number = 0
    for chunk in storage.chunks(path):
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            number += 1
            if line.strip():
                yield number, line.rstrip(b"\r")
    if pending.strip():
        yield number + 1, pending.rstrip(b"\r")


def timed(read: Callable[[], Iterator[Any]], repeats: int) -> tuple[float, int]:
    """The median seconds to read every line, and how many lines."""
    times, count = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        count = sum(1 for _ in read())
        times.append(time.perf_counter() - start)
    return statistics.median(times), count


def main(argv: list[str]) -> None:
    parser = arguments("lines", __doc__)
    parser.add_argument("--line-mb", type=float, default=32.0, help="the long line's size, in MB (10^6 bytes)")
    parser.add_argument("--short-lines", type=int, default=200_000, help="lines of the many-short-lines file")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as root:
        storage = LocalStorage(f"{root}/storage")
        short = b'{"custom_id": "r%06d", "method": "POST", "url": "/v1/embeddings", "body": {"input": "%s"}}\n'
        files = {
            "one long line": b'{"custom_id": "long", "body": "' + b"x" * int(args.line_mb * 1e6) + b'"}\n',
            "many short lines": b"".join(short % (i, b"y" * 60) for i in range(args.short_lines)),
        }
        for name, data in files.items():
            storage.write("in.jsonl", data)
            readers: dict[str, Callable[[], Iterator[Any]]] = {
                "before (quadratic)": lambda: quadratic_lines(storage, "in.jsonl"),
                "lines()": lambda: lines(storage, "in.jsonl"),
                "lines(), capped": lambda: lines(storage, "in.jsonl", CAP),
            }
            for reader, read in readers.items():
                seconds, count = timed(read, args.repeats)
                emit(
                    {
                        "file": name,
                        "bytes": len(data),
                        "lines": count,
                        "reader": reader,
                        "seconds": round(seconds, 3),
                        "mb_per_s": round(len(data) / 1e6 / seconds, 1),
                        "cpus": os.cpu_count(),
                        "python": platform.python_version(),
                    }
                )
