"""Stop sequences, applied to generated text in our layer (engines know nothing of them)."""

from __future__ import annotations


class StopMatcher:
    """Cuts streamed text at the first stop sequence, which is excluded from the output.

    Text that could be the start of a stop sequence is held back until it is known not to be.
    """

    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self.stopped = False
        self._held = ""

    def feed(self, text: str) -> str:
        """Text safe to emit now. After a match, `stopped` is True and the rest is dropped."""
        if self.stopped:
            return ""
        if not self.stops:
            return text
        buf = self._held + text
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped, self._held = True, ""
            return buf[: min(hits)]
        keep = max((k for s in self.stops for k in range(1, len(s)) if buf.endswith(s[:k])), default=0)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """Held-back text at the end of generation."""
        held, self._held = self._held, ""
        return "" if self.stopped else held
