"""The storage root of what the service keeps (`server.state.storage_root`): a local directory, or
any filesystem `pyarrow.fs` reaches (`s3://`, `gs://`, `hdfs://`, a shared mount), behind one small
interface that the ingress replicas and the batch runner share.

Paths are relative to the root, `/`-separated. Whole objects (a file's metadata, a batch's state) are
written to a temporary name and moved into place, so that a reader never sees half of one. Objects are
read streamed (`chunks`: a chunk at a time, never the whole file; a file's lines: `input_lines.lines`)
and appended (`append`: the
filesystem's append stream where it has one; an object store without one rewrites the object, which
is correct but grows with the file).

A local root is private to the service's user (`LocalStorage`): it must be a directory of that user's,
writable by no one else, and not a symbolic link (else `ConfigError` at open; one readable by others is
made 0700); every folder made in it is 0700 and every file 0600, whatever the umask; and no path
leaves it: `..`, an absolute path and a symbolic link anywhere under the root are refused
(`UnsafePathError`), each component opened without following one. An object store's access is its own.

pyarrow is imported only for a root that is a URI, or where `backend="arrow"` asks for it: Ray Serve
alone does not install it, and a local directory needs nothing but the standard library.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Literal, Protocol

from deployments.errors import ConfigError

CHUNK_BYTES = 64 * 1024
_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW

logger = logging.getLogger("ray.serve")


class Storage(Protocol):
    """What the APIs and the runner call on the storage root."""

    def read(self, path: str) -> bytes | None:
        """The whole object (None: there is none)."""
        ...

    def write(self, path: str, data: bytes | Iterable[bytes]) -> None:
        """Replace the object at once (atomic where the filesystem moves atomically); `data` its bytes,
        or chunks of them (an upload streamed: an exception while they are read leaves nothing).
        """
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
        directory; on an object store, checked then written (two writers at the same instant may both win).
        """
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


class UnsafePathError(OSError):
    """A storage path refused: it leaves the root (absolute, `..`) or goes through a symbolic link."""


def local_root(root: str) -> Path:
    """A plain path's directory, absolute: a leading `$XDG_STATE_HOME` is that variable, or
    `~/.local/state` where it is unset or not absolute (as the XDG spec says); `~` is the user's home.
    """
    head, sep, rest = root.partition("/")
    if head in ("$XDG_STATE_HOME", "${XDG_STATE_HOME}"):
        state = os.environ.get("XDG_STATE_HOME", "")
        root = (state if os.path.isabs(state) else "~/.local/state") + sep + rest
    return Path(os.path.abspath(Path(root).expanduser()))


def _make_folders(path: Path) -> None:
    """`path` and its missing parents, each 0700 (whatever the umask)."""
    if path.parent != path and not os.path.lexists(path.parent):
        _make_folders(path.parent)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        return  # made by another replica meanwhile
    fd = os.open(path, _FOLDER_FLAGS)  # chmod through the folder made, never through a link put there
    try:
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


class LocalStorage:
    """A local (or mounted, shared) directory, through the standard library, private to the service's
    user (the rules in the module's docstring). Each call opens the root and each folder under it
    without following a symbolic link, and works relative to the folder it opened.
    """

    def __init__(self, root: str) -> None:
        self.root = local_root(root)
        self._check_root()

    def _check_root(self) -> None:
        root = self.root
        setting = "name another directory in server.state.storage_root"
        if not os.path.lexists(root):
            _make_folders(root)
        if os.path.islink(root):
            raise ConfigError(f"The storage root {root} is a symbolic link: {setting} (the directory itself).")
        try:
            fd = os.open(root, _FOLDER_FLAGS)  # the one checked below, even if a link is swapped in meanwhile
        except NotADirectoryError:
            raise ConfigError(f"The storage root {root} is not a directory: {setting}.") from None
        try:
            info = os.fstat(fd)
            if info.st_uid != os.geteuid():
                raise ConfigError(
                    f"The storage root {root} belongs to uid {info.st_uid}, not to this service's user "
                    f"(uid {os.geteuid()}): {setting}, one of this user's own (or chown this one)."
                )
            mode = stat.S_IMODE(info.st_mode)
            if mode & 0o022:
                raise ConfigError(
                    f"The storage root {root} is writable by others (mode {mode:o}): anything may have been put "
                    f"there. {setting}, or check what is in it and `chmod 700` it."
                )
            if mode & 0o077:
                os.fchmod(fd, 0o700)
                logger.warning("storage root %s was readable by others (mode %o): made 0700", root, mode)
        finally:
            os.close(fd)

    def _refused(self, path: str, why: str) -> UnsafePathError:
        return UnsafePathError(errno.EPERM, f"The storage path {path!r} under {self.root} is refused: {why}.")

    def _parts(self, path: str) -> list[str]:
        parts = path.split("/")
        if "\0" in path or any(part in ("", ".", "..") for part in parts):
            raise self._refused(path, "not a plain relative path (an absolute path, `..`, an empty name)")
        return parts

    def _open_folder(self, folder: int | None, name: str, path: str, create: bool) -> int:
        """The folder `name` in `folder` (the root, for None), opened without following a link; made 0700
        where missing when `create`.
        """
        try:
            return os.open(name, _FOLDER_FLAGS, dir_fd=folder)
        except FileNotFoundError:
            if not create:
                raise
        except NotADirectoryError:  # a file, or a symbolic link (O_NOFOLLOW with O_DIRECTORY says ENOTDIR)
            if stat.S_ISLNK(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode):
                raise self._refused(path, "a symbolic link is never followed") from None
            raise
        try:
            os.mkdir(name, 0o700, dir_fd=folder)
        except FileExistsError:  # made by another writer meanwhile
            return self._open_folder(folder, name, path, create=False)
        fd = self._open_folder(folder, name, path, create=False)
        os.fchmod(fd, 0o700)
        return fd

    @contextlib.contextmanager
    def _folder(self, parts: list[str], path: str, create: bool = False) -> Iterator[int]:
        """The folder of `parts` under the root, opened component by component."""
        fd = self._open_folder(None, str(self.root), path, create=False)
        try:
            for name in parts:
                child = self._open_folder(fd, name, path, create)
                os.close(fd)
                fd = child
            yield fd
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _at(self, path: str, create: bool = False) -> Iterator[tuple[int, str]]:
        """The folder holding `path` (made when `create`), and the object's name in it."""
        *folders, name = self._parts(path)
        with self._folder(folders, path, create) as folder:
            yield folder, name

    def _file(self, folder: int, name: str, path: str, flags: int) -> BinaryIO:
        """The file `name` in `folder`, opened (made 0600 with `os.O_CREAT`) without following a link."""
        try:
            fd = os.open(name, flags | os.O_NOFOLLOW, 0o600, dir_fd=folder)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise self._refused(path, "a symbolic link is never followed") from None
            raise
        try:
            if flags & os.O_CREAT:
                os.fchmod(fd, 0o600)
            writing = (flags & os.O_ACCMODE) != os.O_RDONLY
            return open(fd, ("ab" if flags & os.O_APPEND else "wb") if writing else "rb")
        except BaseException:
            os.close(fd)
            raise

    def _new_file(self, folder: int, name: str, path: str, data: bytes | Iterable[bytes]) -> str:
        """A temporary file beside `name` (0600) holding `data`: its name."""
        temporary = f".{name}.{uuid.uuid4().hex}.tmp"
        try:
            with self._file(folder, temporary, path, os.O_WRONLY | os.O_CREAT | os.O_EXCL) as f:
                for chunk in as_chunks(data):
                    f.write(chunk)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary, dir_fd=folder)
            raise
        return temporary

    def read(self, path: str) -> bytes | None:
        try:
            with self._at(path) as (folder, name), self._file(folder, name, path, os.O_RDONLY) as f:
                return f.read()
        except FileNotFoundError:
            return None

    def write(self, path: str, data: bytes | Iterable[bytes]) -> None:
        with self._at(path, create=True) as (folder, name):
            temporary = self._new_file(folder, name, path, data)
            try:
                os.replace(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)  # keeps its 0600
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temporary, dir_fd=folder)

    def append(self, path: str, data: bytes) -> None:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
        with self._at(path, create=True) as (folder, name), self._file(folder, name, path, flags) as f:
            f.write(data)

    def chunks(self, path: str) -> Iterator[bytes]:
        with self._at(path) as (folder, name):
            opened = self._file(folder, name, path, os.O_RDONLY)
        with opened as f:
            while chunk := f.read(CHUNK_BYTES):
                yield chunk

    def size(self, path: str) -> int | None:
        try:
            with self._at(path) as (folder, name):
                info = os.stat(name, dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if stat.S_ISLNK(info.st_mode):
            raise self._refused(path, "a symbolic link is never followed")
        return info.st_size

    def truncate(self, path: str, size: int) -> None:
        with self._at(path) as (folder, name), self._file(folder, name, path, os.O_WRONLY) as f:
            f.truncate(size)

    def create(self, path: str, data: bytes) -> bool:
        with self._at(path, create=True) as (folder, name):
            temporary = self._new_file(folder, name, path, data)
            try:
                os.link(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)  # one creator wins, whole
                return True
            except FileExistsError:
                return False
            finally:
                os.unlink(temporary, dir_fd=folder)

    def delete(self, path: str) -> None:
        """Remove the object (a symbolic link itself, never what it names), if it is there."""
        with contextlib.suppress(FileNotFoundError), self._at(path) as (folder, name):
            os.unlink(name, dir_fd=folder)

    def names(self, directory: str) -> list[str]:
        try:
            with self._folder(self._parts(directory), directory) as fd, os.scandir(fd) as entries:
                return sorted(
                    e.name for e in entries if e.is_file(follow_symlinks=False) and not e.name.startswith(".")
                )
        except (FileNotFoundError, NotADirectoryError):
            return []


class ArrowStorage:
    """Any filesystem of `pyarrow.fs` (a URI's, or `LocalFileSystem` for a plain path)."""

    def __init__(self, root: str) -> None:
        from pyarrow import fs  # imported only when a root needs it

        self._fs_module = fs
        if "://" in root:
            self.fs, base = fs.FileSystem.from_uri(root)
        else:
            self.fs, base = fs.LocalFileSystem(), str(local_root(root).resolve())
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
    (`auto`: `LocalStorage`, whose rules keep it private to the service's user; `backend="arrow"` on a
    plain path has none of them), or as `backend` says.
    """
    if backend == "arrow" or (backend == "auto" and "://" in root and not root.startswith("file://")):
        return ArrowStorage(root)
    return LocalStorage(root.removeprefix("file://"))
