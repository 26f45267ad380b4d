"""The first minutes after the ready line: concurrency-8 tokens/s as soon as `scripts/run.sh` prints
`mmserve ready:`, and the same `--after-s` seconds after that line (five minutes by default), on the
shipped offline default (serve_config.yaml and models.yaml as they are, port 8000, the captioner
failing and retrying offline). The text workload of `serve`: greedy chats of `--max-tokens`, a new
connection each, `--rounds` per slot. `scripts/stop.sh` stops the service at the end.

    .venv/bin/python -m scripts.bench settle

run.sh's output goes to `--log` (by default a temporary file, named in the first JSON line).
Prints one JSON line per measurement, and the ratio.
"""

from __future__ import annotations

import asyncio
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from scripts.bench.common import ROOT, arguments, emit, primary_name
from scripts.bench.serve import machine, text_run

READY = "mmserve ready: "


@dataclass(frozen=True)
class Running:
    name: str
    base_url: str


def copy_lines(source: IO[str], log: IO[str], ready: threading.Event, url: list[str]) -> None:
    """run.sh's output into the log; `ready` set (and its URL kept) at the ready line."""
    for line in source:
        log.write(line)
        log.flush()
        if line.startswith(READY) and not ready.is_set():
            url.append(line[len(READY) :].split(" | ")[0].strip())
            ready.set()


def main(argv: list[str] | None = None) -> None:
    parser = arguments("settle", __doc__)
    parser.add_argument("--after-s", type=float, default=300)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--log", type=Path)
    args = parser.parse_args(argv)
    log_path = args.log or Path(tempfile.mkstemp(prefix="bench-settle-", suffix=".log")[1])
    emit({"machine": machine(), "started": time.strftime("%Y-%m-%d %H:%M:%S"), "run_sh_log": str(log_path)})
    model = primary_name()
    requests = max(4, args.concurrency * args.rounds)
    start = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [str(ROOT / "scripts/run.sh")],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        assert proc.stdout is not None
        ready, url = threading.Event(), []
        reader = threading.Thread(target=copy_lines, args=(proc.stdout, log, ready, url), daemon=True)
        reader.start()
        try:
            while not ready.wait(1):
                if proc.poll() is not None:
                    raise SystemExit(f"scripts/run.sh exited ({proc.returncode}) before its ready line: see {log_path}")
            at_ready = time.monotonic()
            server = Running("ours", url[0])
            runs = []
            for label, at in (("at the ready line", at_ready), (f"{args.after_s:g} s later", at_ready + args.after_s)):
                time.sleep(max(0.0, at - time.monotonic()))
                result = asyncio.run(text_run(server, model, args.concurrency, requests, args.max_tokens))
                runs.append(result)
                emit({"when": label, "ready_after_start_s": round(at_ready - start, 1), **result})
            emit({"ready_over_later_tok_s": round(runs[0]["output_tok_s"] / runs[1]["output_tok_s"], 2)})
        finally:
            stop = subprocess.run([str(ROOT / "scripts/stop.sh")], cwd=ROOT, capture_output=True, text=True)
            log.write(stop.stdout + stop.stderr)
            proc.wait(120)
            reader.join(10)
