"""The storage root of the Files and Batch APIs (`server.batches.storage_root`): a local directory, or
any filesystem `pyarrow.fs` reaches (`s3://`, `gs://`, `hdfs://`, a shared mount), behind one small
interface that the ingress replicas and the batch runner share.

Paths are relative to the root, `/`-separated. Whole objects (a file's metadata, a batch's state) are
written to a temporary name and moved into place, so that a reader never sees half of one. Lines are
read streamed (`lines`: a chunk at a time, never the whole file) and appended (`append`: the
filesystem's append stream where it has one; an object store without one rewrites the object, which
is correct but grows with the file).

pyarrow is imported only for a root that is a URI, or where `backend="arrow"` asks for it: Ray Serve
alone does not install it, and a local directory needs nothing but the standard library."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal, Protocol

CHUNK_BYTES = 64 * 1024


class Storage(Protocol):
    """What the APIs and the runner call on the storage root."""

    def read(self, path: str) -> bytes | None:
        """The whole object (None: there is none)."""
        ...

    def write(self, path: str, data: bytes | Iterable[bytes]) -> None:
        """Replace the object at once (atomic where the filesystem moves atomically); `data` its bytes,
        or chunks of them (an upload streamed: an exception while they are read leaves nothing)."""
        ...

    def append(self, path: str, data: bytes) -> None: ...

    def chunks(self, path: str) -> Iterator[bytes]:
        """The object's bytes, `CHUNK_BYTES` at a time."""
        ...

    def size(self, path: str) -> int | None: ...

    def truncate(self, path: str, size: int) -> None:
        """Keep the object's first `size` bytes (a torn last line dropped on resume)."""
        ...

    def create(self, path: str, data: bytes) -> bool:
        """Write the object only if there is none (True), else leave it (False): atomic on a local
        directory; on an object store, checked then written (two writers at the same instant may both win)."""
        ...

    def delete(self, path: str) -> None:
        """Remove the object, if it is there."""
        ...

    def names(self, directory: str) -> list[str]:
        """The names of the objects directly under `directory` (none when it does not exist)."""
        ...


def as_chunks(data: bytes | Iterable[bytes]) -> Iterable[bytes]:
    """An object's bytes as chunks: whole bytes are one."""
    return (data,) if isinstance(data, bytes) else data


def lines(storage: Storage, path: str) -> Iterator[tuple[int, bytes]]:
    """The object's lines, numbered from 1, without their line ends, read a chunk at a time: at most a
    chunk and the longest line are held. Blank lines are skipped (their numbers still count)."""
    pending = b""
    number = 0
    for chunk in storage.chunks(path):
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            number += 1
            if line.strip():
                yield number, line.rstrip(b"\r")
    if pending.strip():
        yield number + 1, pending.rstrip(b"\r")


class LocalStorage:
    """A local (or mounted, shared) directory, through the standard library."""

    def __init__(self, root: str) -> None:
        self.root = Path(root).expanduser()

    def _path(self, path: str) -> Path:
        return self.root / path

    def read(self, path: str) -> bytes | None:
        try:
            return self._path(path).read_bytes()
        except FileNotFoundError:
            return None

    def write(self, path: str, data: bytes | Iterable[bytes]) -> None:
        target = self._path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
        try:
            with temporary.open("wb") as f:
                for chunk in as_chunks(data):
                    f.write(chunk)
            os.replace(temporary, target)
        finally:
            temporary.unlink(missing_ok=True)

    def append(self, path: str, data: bytes) -> None:
        target = self._path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("ab") as f:
            f.write(data)
            f.flush()

    def chunks(self, path: str) -> Iterator[bytes]:
        with self._path(path).open("rb") as f:
            while chunk := f.read(CHUNK_BYTES):
                yield chunk

    def size(self, path: str) -> int | None:
        try:
            return self._path(path).stat().st_size
        except FileNotFoundError:
            return None

    def truncate(self, path: str, size: int) -> None:
        os.truncate(self._path(path), size)

    def create(self, path: str, data: bytes) -> bool:
        target = self._path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
        temporary.write_bytes(data)
        try:
            os.link(temporary, target)  # fails when the target exists: one creator wins, whole
            return True
        except FileExistsError:
            return False
        finally:
            temporary.unlink()

    def delete(self, path: str) -> None:
        self._path(path).unlink(missing_ok=True)

    def names(self, directory: str) -> list[str]:
        folder = self._path(directory)
        if not folder.is_dir():
            return []
        return sorted(p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))


class ArrowStorage:
    """Any filesystem of `pyarrow.fs` (a URI's, or `LocalFileSystem` for a plain path)."""

    def __init__(self, root: str) -> None:
        from pyarrow import fs  # imported only when a root needs it

        self._fs_module = fs
        if "://" in root:
            self.fs, base = fs.FileSystem.from_uri(root)
        else:
            self.fs, base = fs.LocalFileSystem(), str(Path(root).expanduser().resolve())
        self.base = base.rstrip("/")
        self.fs.create_dir(self.base, recursive=True)

    def _path(self, path: str) -> str:
        return f"{self.base}/{path}"

    def _missing(self, path: str) -> bool:
        return self.fs.get_file_info(self._path(path)).type == self._fs_module.FileType.NotFound

    def read(self, path: str) -> bytes | None:
        if self._missing(path):
            return None
        with self.fs.open_input_stream(self._path(path)) as f:
            data: bytes = f.read()
        return data

    def write(self, path: str, data: bytes | Iterable[bytes]) -> None:
        target = self._path(path)
        self.fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
        temporary = f"{target.rsplit('/', 1)[0]}/.{target.rsplit('/', 1)[1]}.{uuid.uuid4().hex}.tmp"
        try:
            with self.fs.open_output_stream(temporary) as f:
                for chunk in as_chunks(data):
                    f.write(chunk)
        except BaseException:
            with contextlib.suppress(OSError):
                self.fs.delete_file(temporary)
            raise
        self.fs.move(temporary, target)

    def append(self, path: str, data: bytes) -> None:
        target = self._path(path)
        self.fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
        try:
            with self.fs.open_append_stream(target) as f:
                f.write(data)
        except NotImplementedError:  # an object store: no append, rewrite the object
            self.write(path, (self.read(path) or b"") + data)

    def chunks(self, path: str) -> Iterator[bytes]:
        with self.fs.open_input_stream(self._path(path)) as f:
            while chunk := f.read(CHUNK_BYTES):
                yield chunk

    def size(self, path: str) -> int | None:
        info = self.fs.get_file_info(self._path(path))
        return None if info.type == self._fs_module.FileType.NotFound else int(info.size)

    def truncate(self, path: str, size: int) -> None:
        with self.fs.open_input_stream(self._path(path)) as f:
            kept: bytes = f.read(size)
        self.write(path, kept)

    def create(self, path: str, data: bytes) -> bool:
        if not self._missing(path):
            return False
        self.write(path, data)
        return True

    def delete(self, path: str) -> None:
        if not self._missing(path):
            self.fs.delete_file(self._path(path))

    def names(self, directory: str) -> list[str]:
        selector: Any = self._fs_module.FileSelector(self._path(directory), allow_not_found=True)
        infos = self.fs.get_file_info(selector)
        return sorted(
            i.base_name for i in infos if i.type == self._fs_module.FileType.File and not i.base_name.startswith(".")
        )


def open_storage(root: str, backend: Literal["auto", "local", "arrow"] = "auto") -> Storage:
    """The storage at `root`: a URI through pyarrow.fs, a plain path through the standard library
    (`auto`), or as `backend` says."""
    if backend == "arrow" or (backend == "auto" and "://" in root and not root.startswith("file://")):
        return ArrowStorage(root)
    return LocalStorage(root.removeprefix("file://"))
