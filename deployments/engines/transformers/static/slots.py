"""Which slot a new sequence takes, and what each slot still holds: llama.cpp's slot reuse.

A slot keeps, after its sequence ends, the token ids whose K/V that sequence wrote there (its prompt,
then each generated token fed back to a decode step; for a sequence cancelled midway, only what was
written), with the LoRA adapter they were computed under. A new sequence takes the free slot whose
held tokens share the longest prefix with its prompt under the same adapter (an adapter changes every
K/V: a prefix computed under another is no match), when that prefix is more than a tenth of its prompt
(llama.cpp's ``--slot-prompt-similarity``, 0.1), so that a chat template's few opening tokens do not
take a session's slot; otherwise the least recently freed slot, so that recent prefixes survive. The
sequence then prefills from the end of the reused prefix, at most its prompt's last token, whose
logits give its first generated token.

The cache is never cleared: positions past the reused prefix keep the previous sequence's K/V until
they are overwritten, and `SlotCache.attend` never lets a query see a key past its own position.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MIN_SHARE = 0.1  # a slot is chosen for its prefix only when that covers more than this share of the prompt
_NOTHING = np.zeros(0, dtype=np.int64)


def common_prefix(held: np.ndarray, prompt: np.ndarray) -> int:
    """How many first tokens `held` and `prompt` share."""
    n = min(len(held), len(prompt))
    differ = np.flatnonzero(held[:n] != prompt[:n])
    return int(differ[0]) if differ.size else n


class SlotTable:
    """The slots of a static KV cache on the loop's side: which are free (least recently freed first)
    and what each holds. `reuse` False: a slot keeps nothing (every prompt is computed whole).
    """

    def __init__(self, slots: int, *, reuse: bool = True) -> None:
        self.reuse = reuse
        self._free: dict[int, None] = dict.fromkeys(range(slots))  # an ordered set: least recently freed first
        self._held: list[np.ndarray] = [_NOTHING] * slots
        self._adapter: list[str | None] = [None] * slots

    @property
    def free(self) -> int:
        return len(self._free)

    def take(self, prompt: Sequence[int], adapter: str | None, *, reuse: bool = True) -> tuple[int, int]:
        """A free slot for a sequence of `prompt` under `adapter` (None: the base model), and how many of
        the prompt's first tokens that slot holds already (their K/V is reused: the sequence prefills
        from there). `reuse` False: the least recently freed slot, and nothing reused.
        """
        ids = np.asarray(prompt, dtype=np.int64)
        oldest = next(iter(self._free))
        shared = {
            slot: common_prefix(self._held[slot], ids)
            for slot in self._free
            if self.reuse and reuse and self._adapter[slot] == adapter
        }
        best = max(shared, key=lambda slot: shared[slot], default=oldest)  # ties: the least recently freed
        slot = best if shared.get(best, 0) > MIN_SHARE * len(ids) else oldest
        del self._free[slot]
        self._adapter[slot] = adapter
        return slot, max(0, min(shared.get(slot, 0), len(ids) - 1))

    def release(self, slot: int, written: Sequence[int]) -> None:
        """`slot` is free again, holding the K/V of `written` (the tokens at its positions 0, 1, ...)."""
        self._held[slot] = np.asarray(written, dtype=np.int64) if self.reuse else _NOTHING
        self._free[slot] = None

    def forget(self, adapter: str) -> None:
        """Drop what the slots hold under `adapter` (loaded again or unloaded: its weights may change)."""
        for slot, name in enumerate(self._adapter):
            if name == adapter:
                self._held[slot] = _NOTHING

    def held(self, slot: int) -> list[int]:
        """The tokens whose K/V `slot` holds (for checks)."""
        return [int(t) for t in self._held[slot]]
