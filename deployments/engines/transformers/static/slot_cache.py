"""A static KV cache of slots, and the attention function that reads and writes it.

Per layer, keys and values live in one tensor each, `[slots + 1, kv_heads, max_len, head_dim]`,
allocated once: a sequence holds a slot for its life and its token at position p sits at
`[slot, :, p]`. The last slot is scratch: the padding rows of a step (a batch padded up to its
bucket, a prefill chunk padded up to its length) write there, so that no live slot is touched.

`SlotCache.attend` is registered with transformers' `AttentionInterface` under a name of its own,
and the model's own attention modules call it (their projections, norms and RoPE unchanged) with
the step's tensors as keyword arguments that the model passes through: `slot_write` (the slot each
token's K/V is written to), `slot_read` (the slot each row attends over), `slot_positions` (each
token's position: where its K/V is written, and the last key it may see) and `slot_window` (how
many positions of the slot a step reads, a bucket at least one past the row's last position). No
mask function is registered: transformers then builds no mask at all, and the causal rule
(`key position <= query position`, within a sliding window where the layer has one) is applied
here over the window alone. That rule is also what lets a slot be reused without clearing: keys past
a query's position, stale or not, are never read. Every tensor it touches keeps its address across steps, so the step
can be compiled and captured in a CUDA graph.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
from torch.nn import functional

_names = itertools.count()


class SlotCache:
    """Keys and values of `slots` sequences (and the scratch slot) of up to `max_len` tokens."""

    def __init__(self, config: Any, slots: int, max_len: int, dtype: torch.dtype, device: torch.device | str) -> None:
        text = config.get_text_config()
        heads = text.num_attention_heads
        self.head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
        self.kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
        self.layers = int(text.num_hidden_layers)
        self.slots, self.max_len = slots, max_len
        self.scratch = slots  # the padding rows' slot
        shape = (slots + 1, self.kv_heads, max_len, self.head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(self.layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(self.layers)]
        self.key_positions = torch.arange(max_len, device=device)
        self.name = f"mmserve_slots_{next(_names)}"

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in (*self.keys, *self.values))

    def register(self, model: Any) -> None:
        """Make `model`'s attention modules call `attend` (a name of this cache's own, so that
        several engines in one process keep apart).
        """
        from transformers import AttentionInterface

        AttentionInterface.register(self.name, self.attend)
        model.set_attn_implementation(self.name)

    def unregister(self) -> None:
        from transformers import AttentionInterface

        AttentionInterface._global_mapping.pop(self.name, None)

    def attend(
        self,
        module: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        *,
        slot_write: torch.Tensor,
        slot_read: torch.Tensor,
        slot_positions: torch.Tensor,
        slot_window: int,
        scaling: float | None = None,
        dropout: float = 0.0,
        sliding_window: int | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        """`query` `[rows, heads, tokens, head_dim]`, `key`/`value` `[rows, kv_heads, tokens, head_dim]`
        (after RoPE); `slot_write`, `slot_positions` `[rows, tokens]`; `slot_read` `[rows]`. Returns
        the output `[rows, tokens, heads, head_dim]` as transformers' attention functions do.
        """
        layer = module.layer_idx
        keys, values = self.keys[layer], self.values[layer]
        keys[slot_write, :, slot_positions] = key.transpose(1, 2).to(keys.dtype)
        values[slot_write, :, slot_positions] = value.transpose(1, 2).to(values.dtype)
        window_keys = keys[:, :, :slot_window].index_select(0, slot_read)
        window_values = values[:, :, :slot_window].index_select(0, slot_read)
        key_positions = self.key_positions[:slot_window].view(1, 1, 1, -1)
        query_positions = slot_positions.unsqueeze(1).unsqueeze(-1)  # [rows, 1, tokens, 1]
        # A slot keeps its last sequence's K/V past the prefix a new one reuses (`slots.SlotTable`): every
        # path (prefill chunks, decode steps, a captured window bucket, a sliding window) reads keys up
        # to the query's own position alone, all written by this sequence (this call writes first) or
        # reused. Padding (a chunk's tail, a batch's extra rows) writes to the scratch slot; its outputs are dropped.
        allowed = key_positions <= query_positions
        window = sliding_window or getattr(module, "sliding_window", None)
        if window:
            allowed = allowed & (key_positions > query_positions - window)
        out = functional.scaled_dot_product_attention(
            query,
            window_keys,
            window_values,
            attn_mask=allowed,
            scale=scaling,
            enable_gqa=query.shape[1] != window_keys.shape[1],
        )
        return out.transpose(1, 2).contiguous(), None
