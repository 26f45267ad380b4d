"""What the llama.cpp engine reads of a GGUF file before loading it: the header's key-value
metadata (scalars; arrays only by length, through the one GGUF reader, `config.gguf`), enough to
size the KV cache and cap the context.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deployments.config.gguf import read_gguf
from deployments.errors import ConfigError


def read_metadata(path: Path) -> dict[str, Any]:
    """The header's key-value pairs (an array's value is its length; `config.gguf` reads them).
    `ConfigError` when the file is not a GGUF file (version 2 or later).
    """
    try:
        return read_gguf(path, tensors=False)[0]
    except (OSError, ValueError, struct.error) as exc:
        raise ConfigError(f"{path}: cannot read its GGUF header: {exc}") from exc


@dataclass(frozen=True)
class GGUFModel:
    """A GGUF model's shape, as far as the engine needs it."""

    architecture: str
    context_length: int | None
    layers: int | None
    kv_width: int | None  # key + value width per token and layer (elements), over the KV heads
    vocab_size: int | None

    def kv_bytes_per_token(self, cache_type: str = "f16") -> int | None:
        """KV-cache bytes of one token in a cache of `cache_type` cells: f16 (llama.cpp's default),
        or q8_0 (blocks of 32 values in 34 bytes). None: unknown shape.
        """
        if self.layers is None or self.kv_width is None:
            return None
        f16 = 2 * self.layers * self.kv_width
        return f16 if cache_type == "f16" else -(-f16 * 34 // 64)


def describe_gguf(path: Path) -> GGUFModel:
    """The model's shape as the GGUF file's metadata gives it (architecture, context, layers, KV width, vocabulary)."""
    meta = read_metadata(path)
    arch = str(meta.get("general.architecture", "llama"))

    def number(key: str) -> int | None:
        value = meta.get(f"{arch}.{key}")
        return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

    embedding, heads = number("embedding_length"), number("attention.head_count")
    kv_heads = number("attention.head_count_kv") or heads
    key_len, value_len = number("attention.key_length"), number("attention.value_length")
    if heads and embedding:
        key_len = key_len or embedding // heads
        value_len = value_len or embedding // heads
    kv_width = kv_heads * (key_len + value_len) if kv_heads and key_len and value_len else None
    vocab = number("vocab_size") or meta.get("tokenizer.ggml.tokens")
    return GGUFModel(arch, number("context_length"), number("block_count"), kv_width, vocab)
