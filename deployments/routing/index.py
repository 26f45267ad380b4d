"""`PrefixIndex`: which replicas hold which prefix blocks, as one router has seen it.

Each block hash (`keys.block_hashes`) maps to the replicas the router sent it to (with when), in
least-recently-used order over all blocks, bounded by `capacity` blocks: a block no request has
used for longest is forgotten first, so memory stays bounded whatever the prompts' length.
What a replica reports it holds (`correct`) replaces the router's guess for that replica: blocks it
no longer holds are dropped (unless sent since the report was taken), blocks another router sent
there are added. A replica that went away is forgotten whole (`forget`), and a new one starts empty.

It also keeps, for each block, the replicas where a prompt the router sent went on past it: a request
whose match at a replica stops at such a block leaves another prompt's chain there (`branched`), so
what it shares with that replica is a common beginning (a system prompt, few-shot examples), not a
conversation of its own continued.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable, Sequence


class PrefixIndex:
    """Block hash -> {replica: when the router last sent it there}, LRU over blocks."""

    def __init__(self, capacity: int = 65_536) -> None:
        self.capacity = capacity
        self._blocks: OrderedDict[int, dict[str, float]] = OrderedDict()
        self._held: dict[str, set[int]] = {}  # replica -> its blocks (for `forget` and `correct`)
        self._continued: dict[int, set[str]] = {}  # block -> replicas where a sent prompt went on past it

    def __len__(self) -> int:
        return len(self._blocks)

    def replicas(self) -> set[str]:
        return set(self._held)

    def blocks_of(self, replica: str) -> int:
        return len(self._held.get(replica, ()))

    def match(self, blocks: Sequence[int], replicas: Iterable[str]) -> dict[str, int]:
        """How many of `blocks`' leading blocks each of `replicas` holds (a chain: a replica's match
        ends at its first missing block).
        """
        depth = dict.fromkeys(replicas, 0)
        alive = set(depth)
        for i, block in enumerate(blocks):
            holders = self._blocks.get(block)
            if not holders:
                break
            alive = {replica for replica in alive if replica in holders}
            if not alive:
                break
            for replica in alive:
                depth[replica] = i + 1
        return depth

    def branched(self, blocks: Sequence[int], depth: dict[str, int]) -> set[str]:
        """The replicas (of `depth`, as `match` found it) whose match stops inside a longer prompt the
        router sent there: the request goes on past its last matched block, and so did another prompt,
        elsewhere. A conversation continued matches up to the end of its last turn's prompt instead.
        """
        return {
            replica
            for replica, matched in depth.items()
            if 0 < matched < len(blocks) and replica in self._continued.get(blocks[matched - 1], ())
        }

    def insert(self, blocks: Sequence[int], replica: str, now: float) -> None:
        """`replica` now holds `blocks` (the router sent them there at `now`)."""
        held = self._held.setdefault(replica, set())
        for block in blocks:
            holders = self._blocks.get(block)
            if holders is None:
                holders = self._blocks[block] = {}
            else:
                self._blocks.move_to_end(block)
            holders[replica] = now
            held.add(block)
        for block in blocks[:-1]:
            self._continued.setdefault(block, set()).add(replica)
        self._evict()

    def forget(self, replica: str) -> None:
        """`replica` went away: none of its blocks is held anywhere by it."""
        for block in self._held.pop(replica, ()):
            self._drop(block, replica)

    def correct(self, replica: str, reported: Collection[int], taken_before: float) -> None:
        """`replica` reports that it holds `reported` (its whole set) as of some time after
        `taken_before`: blocks the router sent there before then that it does not report are
        dropped; reported blocks the router did not know of are added (sent by another router).
        """
        held = self._held.setdefault(replica, set())
        for block in [b for b in held if b not in reported]:
            holders = self._blocks.get(block)
            if holders is not None and holders.get(replica, 0.0) < taken_before:
                self._drop(block, replica)
        for block in reported:
            if block not in held:
                self._blocks.setdefault(block, {})[replica] = taken_before
                held.add(block)
        self._evict()

    def _drop(self, block: int, replica: str) -> None:
        holders = self._blocks.get(block)
        if holders is not None:
            holders.pop(replica, None)
            if not holders:
                del self._blocks[block]
        continued = self._continued.get(block)
        if continued is not None:
            continued.discard(replica)
            if not continued:
                del self._continued[block]
        held = self._held.get(replica)
        if held is not None:
            held.discard(block)

    def _evict(self) -> None:
        while len(self._blocks) > self.capacity:
            block, holders = self._blocks.popitem(last=False)
            self._continued.pop(block, None)
            for replica in holders:
                held = self._held.get(replica)
                if held is not None:
                    held.discard(block)
