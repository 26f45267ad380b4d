"""Stop sequences, applied to generated text in our layer (engines know nothing of them)."""

from __future__ import annotations


class StopMatcher:
    """Cuts streamed text at the first stop sequence, which is excluded from the output (kept, and
    the text cut after it, with `include`: vLLM's `include_stop_str_in_output`).

    Text that could be the start of a stop sequence is held back until it is known not to be, so
    the cut is where the whole text's first stop begins, however the text was split into pieces
    (also when one stop occurs inside another: "bc" in "abcd").
    """

    def __init__(self, stops: list[str], include: bool = False) -> None:
        self.stops = [s for s in stops if s]
        self.include = include
        self.stopped = False
        self.matched: str | None = None  # the stop sequence that ended the text
        self._held = ""
        self._longest = max(map(len, self.stops), default=0)

    def feed(self, text: str) -> str:
        """Text safe to emit now. After a match, `stopped` is True and the rest is dropped."""
        if self.stopped:
            return ""
        if not self.stops:
            return text
        return self._scan(self._held + text, final=False)

    def flush(self) -> str:
        """Held-back text at the end of generation (cut if it holds a stop)."""
        if self.stopped or not self._held:
            return ""
        return self._scan(self._held, final=True)

    def _scan(self, buf: str, final: bool) -> str:
        first = min((i for i in (buf.find(s) for s in self.stops) if i >= 0), default=len(buf) + 1)
        # The earliest place where a stop may begin that only more text can complete or rule out.
        start = max(0, len(buf) - self._longest + 1)
        pending = len(buf) if final else next((i for i in range(start, len(buf)) if self._open(buf[i:])), len(buf))
        if first <= pending:
            self.stopped, self._held = True, ""
            self.matched = min((s for s in self.stops if buf.find(s) == first), key=len)
            return buf[: first + len(self.matched)] if self.include else buf[:first]
        self._held = buf[pending:]
        return buf[:pending]

    def _open(self, tail: str) -> bool:
        return any(len(s) > len(tail) and s.startswith(tail) for s in self.stops)
