"""How llama.cpp's KV cache is laid out for an engine.

`max_num_seqs` streams of `max_model_len` cells each (one per slot, as llama-server with ``-np``),
unless `mem` is smaller than that: then one pool of `mem` MB that the slots share (llama.cpp's
unified KV cache; a sequence may still reach `max_model_len`).

Cells are f16 (llama.cpp's own default: its fastest prompt reading on the CPU) unless
`kv_cache_dtype: q8_0` or `batch_invariant`. With `batch_invariant` (q8_0 cells, a stream per slot) a
greedy answer does not depend on what else runs: llama.cpp's CPU flash attention has three kernels,
chosen by the step's shape (one query row of one stream over 512 cells or more: split over the threads
and reduced; 64 rows or more of one stream: tiled; else one row at a time), and the first two take f16
cells only, so with q8_0 every row is computed the same way in any batch; a stream of its own keeps
a sequence's cells in position order, where a shared pool puts them wherever it has room and the
attention's running sums see them in another order. The weights' products are computed row by row
(the GGUF's Q4_1 and Q8_0 kernels), whatever the batch. The price is the one-row kernel for every
prompt: 2.7 to 4 times slower to read a prompt of thousands of tokens on 2 cores (docs/benchmarks.md).
"""

from __future__ import annotations

from typing import Literal

from deployments.config import EngineParams


def kv_cache_type(params: EngineParams) -> Literal["f16", "q8_0"]:
    """The KV cells' type: `kv_cache_dtype`; for auto, q8_0 with `batch_invariant`, else f16 (see the
    module's docstring).
    """
    if params.kv_cache_dtype == "auto":
        return "q8_0" if params.batch_invariant else "f16"
    return params.kv_cache_dtype


def kv_layout(params: EngineParams, max_model_len: int, bytes_per_token: int | None) -> tuple[int, bool]:
    """`(cells, unified)`: a stream of `max_model_len` cells per slot, or one shared pool of `mem`
    MB when that is smaller (see the module's docstring).
    """
    per_slot = params.max_num_seqs * max_model_len
    if params.mem is None or bytes_per_token is None:
        return per_slot, False
    budget = params.mem * 2**20 // bytes_per_token
    return (per_slot, False) if budget >= per_slot else (max(budget, max_model_len), True)
