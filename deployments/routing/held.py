"""`HeldPrefixes`: the decoder replica's own account of the prefixes its engine still holds, which it
reports to the routers (`PrimaryDecoder.record_routing_stats`, every `request_routing_stats_period_s`).

The engine does not list its cache, so the replica keeps the prompts it served most recently, as
their block hashes (`keys.prefix_blocks`), as many as its engine keeps: one per slot (llama.cpp keeps
a slot's last prompt until another needs the slot), then, while their KV cells fit in the host-memory
prompt cache (`cache_ram_mib`), older ones. The report is the union of their blocks, at most
`MAX_REPORTED` of the most recent ones: a prefix shared by many prompts is one set of blocks.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

MAX_REPORTED = 8_192  # blocks per report (about 2M characters of distinct prefixes)


class HeldPrefixes:
    """`slots`: prompts the engine keeps in its slots; `host_bytes`: its host-memory prompt cache;
    `bytes_per_token`: a token's KV cells (None: unknown, the host cache is not counted).
    """

    def __init__(self, slots: int, host_bytes: int = 0, bytes_per_token: int | None = None) -> None:
        self._slots = slots
        self._host_bytes = host_bytes
        self._bytes_per_token = bytes_per_token
        self._prompts: OrderedDict[int, tuple[Sequence[int], int]] = OrderedDict()  # last block -> (blocks, tokens)

    def served(self, blocks: Sequence[int], tokens: int = 0) -> None:
        """A prompt entered the engine (`tokens`: its length, when known). A prompt that extends a
        held one replaces it (the next turn of a session).
        """
        if not blocks:
            return
        for key, (old, _) in list(self._prompts.items()):
            if len(old) <= len(blocks) and blocks[len(old) - 1] == key:
                del self._prompts[key]
        self._prompts[blocks[-1]] = (blocks, tokens)
        self._prompts.move_to_end(blocks[-1])
        self._trim()

    def _trim(self) -> None:
        kept, host = 0, 0
        for key in reversed(list(self._prompts)):
            kept += 1
            if kept <= self._slots:
                continue
            _, tokens = self._prompts[key]
            host += tokens * (self._bytes_per_token or 0)
            if not self._bytes_per_token or not tokens or host > self._host_bytes:
                del self._prompts[key]

    def report(self) -> dict[str, Any]:
        """The routing stats: `at` (when, Unix seconds) and `blocks` (held block hashes, newest first)."""
        blocks: dict[int, None] = {}
        for prompt, _ in reversed(self._prompts.values()):
            blocks.update(dict.fromkeys(prompt))
            if len(blocks) >= MAX_REPORTED:
                break
        return {"at": time.time(), "blocks": list(blocks)[:MAX_REPORTED], "prompts": len(self._prompts)}
