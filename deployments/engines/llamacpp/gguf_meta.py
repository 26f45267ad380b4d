"""What the llama.cpp engine reads of a GGUF file before loading it: the header's key-value
metadata (scalars; arrays only by length), enough to size the KV cache and cap the context.

The `gguf` package's `GGUFReader` reads the same, but builds an array per vocabulary entry
(1.7 s for SmolLM2's 49k tokens on 2 cores); this reader skips arrays and reads only the header.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from deployments.errors import ConfigError

# GGUF value types: struct formats of the scalars; 8 is a string, 9 an array.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def _read(f: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise ValueError("truncated header")
    return struct.unpack(fmt, data)[0]


def _string(f: BinaryIO) -> str:
    return f.read(_read(f, "<Q")).decode("utf-8", errors="replace")


def _value(f: BinaryIO, kind: int) -> Any:
    if kind in _SCALARS:
        return _read(f, _SCALARS[kind])
    if kind == _STRING:
        return _string(f)
    if kind == _ARRAY:
        item, count = _read(f, "<I"), _read(f, "<Q")
        if item in _SCALARS:
            f.seek(struct.calcsize(_SCALARS[item]) * count, 1)
        elif item == _STRING:
            for _ in range(count):
                f.seek(_read(f, "<Q"), 1)
        else:  # arrays of arrays: read through them
            for _ in range(count):
                _value(f, item)
        return count  # an array is known by its length only
    raise ValueError(f"unknown value type {kind}")


def read_metadata(path: Path) -> dict[str, Any]:
    """The header's key-value pairs (an array's value is its length). `ConfigError` when the file
    is not a GGUF file (version 2 or later)."""
    try:
        with path.open("rb") as f:
            if f.read(4) != b"GGUF":
                raise ValueError("not a GGUF file (bad magic)")
            version = _read(f, "<I")
            if version < 2:
                raise ValueError(f"GGUF version {version} is not supported (2 or later)")
            _read(f, "<Q")  # tensor count
            count = _read(f, "<Q")
            meta: dict[str, Any] = {}
            for _ in range(count):
                key = _string(f)
                meta[key] = _value(f, _read(f, "<I"))
            return meta
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
        or q8_0 (blocks of 32 values in 34 bytes). None: unknown shape."""
        if self.layers is None or self.kv_width is None:
            return None
        f16 = 2 * self.layers * self.kv_width
        return f16 if cache_type == "f16" else -(-f16 * 34 // 64)


def describe_gguf(path: Path) -> GGUFModel:
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
