"""A batch's progress is its output and error files themselves: a line is appended to one of them as
soon as it finishes, and nothing else records which lines are done. On resume (a runner restarted,
the service redeployed) the files are read back, a torn last line (a crash mid-append) is cut off, and
every custom_id found there is skipped: no finished line runs again and none is lost. A line that
could not be read (not JSON, over the line cap) has no custom_id: its error line names its `line`
number instead, and that number is skipped. The counts and usage totals are recomputed from the same
lines.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from deployments.batch_runner.input_lines import lines
from deployments.protocol.openai.batches import EXPIRED_LINE, Batch, BatchUsage, RequestCounts
from deployments.state.storage import Storage


@dataclass
class Progress:
    """What a batch's files say is done."""

    done: set[str] = field(default_factory=set)
    unreadable: set[int] = field(default_factory=set)  # numbers of the lines failed without a custom_id
    completed: int = 0
    failed: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    expired: int = 0  # of the failed: lines the window's end left unrun (`batch_expired`)

    def count(self, line: dict[str, Any], ok: bool) -> None:
        """One finished line (`ok`: written to the output file)."""
        if line.get("custom_id") is None:
            self.unreadable.add(int((line.get("error") or {}).get("line") or 0))
        else:
            self.done.add(line["custom_id"])
        if ok:
            self.completed += 1
            usage = ((line.get("response") or {}).get("body") or {}).get("usage") or {}
            self.input_tokens += int(usage.get("prompt_tokens", usage.get("input_tokens", 0)) or 0)
            self.output_tokens += int(usage.get("completion_tokens", usage.get("output_tokens", 0)) or 0)
        else:
            self.failed += 1
            self.expired += (line.get("error") or {}).get("code") == EXPIRED_LINE["code"]

    def counts(self, total: int) -> RequestCounts:
        return RequestCounts(total=total, completed=self.completed, failed=self.failed)

    def usage(self) -> BatchUsage:
        return BatchUsage(
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            total_tokens=self.input_tokens + self.output_tokens,
        )

    def applied(self, batch: Batch, total: int | None = None) -> Batch:
        """`batch` with these counts and usage, of `total` lines (default: the batch's own total)."""
        total = batch.request_counts.total if total is None else total
        return batch.model_copy(update={"request_counts": self.counts(total), "usage": self.usage()})


def _complete_size(storage: Storage, path: str) -> int | None:
    """The size of the object's complete lines (None: no object): where a torn last line begins."""
    size = storage.size(path)
    if not size:
        return size
    complete = 0
    offset = 0
    for chunk in storage.chunks(path):
        newline = chunk.rfind(b"\n")
        if newline >= 0:
            complete = offset + newline + 1
        offset += len(chunk)
    return complete


def resume(storage: Storage, output_path: str, error_path: str) -> Progress:
    """The progress that a batch's output and error files record, each cut to its last complete line."""
    progress = Progress()
    for path, ok in ((output_path, True), (error_path, False)):
        complete = _complete_size(storage, path)
        if complete is None:
            continue
        if complete != storage.size(path):
            storage.truncate(path, complete)
        for _, raw in lines(storage, path):
            progress.count(json.loads(raw), ok)
    return progress
