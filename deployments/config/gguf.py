"""A GGUF file's header, read without its tensors: the key-value metadata (scalars and strings; an
array only by its length) and, where asked, each tensor's shape. The one reader of the format, for
the LoRA checks (`lora.py`: an adapter's type, rank and tensor shapes against its base's) and for the
llama.cpp engine (`engines/llamacpp/gguf_meta.py`: the model's shape before it loads).

The `gguf` package's `GGUFReader` reads the same, but builds an array per vocabulary entry (1.7 s
for SmolLM2's 49k tokens on 2 cores); this reader skips arrays and stops at the tensors' data.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO

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


def read_gguf(path: Path, tensors: bool = True) -> tuple[dict[str, Any], dict[str, list[int]]]:
    """The header's key-value pairs (an array's value is its length) and, with `tensors`, each
    tensor's shape in ggml order (``[in, out]`` for a weight; without `tensors`, none). `ValueError`
    when the file is not a GGUF file of version 2 or later, `OSError` when it cannot be read.
    """
    with path.open("rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError("bad magic")
        version = _read(f, "<I")
        if version < 2:
            raise ValueError(f"GGUF version {version} is not supported (2 or later)")
        count_tensors, count = _read(f, "<Q"), _read(f, "<Q")
        meta: dict[str, Any] = {}
        for _ in range(count):
            key = _string(f)
            meta[key] = _value(f, _read(f, "<I"))
        shapes: dict[str, list[int]] = {}
        for _ in range(count_tensors if tensors else 0):
            name = _string(f)
            shapes[name] = [_read(f, "<Q") for _ in range(_read(f, "<I"))]
            _read(f, "<I")  # type
            _read(f, "<Q")  # offset
    return meta, shapes
