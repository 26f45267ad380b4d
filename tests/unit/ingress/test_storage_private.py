"""A local storage root is private to the service's user: 0700 folders and 0600 files whatever the
umask, a root of another user's, writable by others or a symbolic link refused, and no path that leaves
the root (`..`, a symbolic link under it)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from deployments.config.state import StateConfig
from deployments.errors import ConfigError
from deployments.state.records import SECRET, stored_owners
from deployments.state.storage import LocalStorage, UnsafePathError, open_storage


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def permissive_umask() -> Iterator[None]:
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


def test_folders_are_0700_and_files_0600_whatever_the_umask(tmp_path, permissive_umask):
    root = tmp_path / "state" / "mmserve" / "storage"
    storage = LocalStorage(str(root))
    stored_owners(storage)  # owners.secret, through `create`
    storage.write("files/deep/x.json", b"{}")
    storage.append("batches/out.jsonl", b"one\n")
    assert storage.create("once/made", b"first")

    for folder in (tmp_path / "state", tmp_path / "state" / "mmserve", root, root / "files", root / "files" / "deep"):
        assert mode(folder) == 0o700, folder
    for file in (
        root / SECRET,
        root / "files" / "deep" / "x.json",
        root / "batches" / "out.jsonl",
        root / "once" / "made",
    ):
        assert mode(file) == 0o600, file


def test_a_root_of_another_user_is_refused(tmp_path):
    if os.geteuid() == 0:
        root = tmp_path / "theirs"
        root.mkdir(mode=0o700)
        os.chown(root, 65534, 65534)
    else:
        root = Path("/")  # root's own: refused before anything is written
    with pytest.raises(ConfigError, match=f"{root}.*belongs to uid"):
        LocalStorage(str(root))


@pytest.mark.parametrize("writable", [0o770, 0o707, 0o1777], ids=["group", "world", "sticky-world"])
def test_a_root_writable_by_others_is_refused(tmp_path, writable):
    root = tmp_path / "shared"
    root.mkdir()
    root.chmod(writable)
    with pytest.raises(ConfigError, match=f"{root}.*writable by others"):
        open_storage(str(root))
    assert mode(root) == writable  # left as it is


def test_a_root_readable_by_others_is_made_0700(tmp_path):
    root = tmp_path / "old"
    root.mkdir()
    root.chmod(0o755)
    LocalStorage(str(root))
    assert mode(root) == 0o700


def test_a_root_that_is_a_symbolic_link_is_refused(tmp_path):
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(ConfigError, match="symbolic link"):
        LocalStorage(str(tmp_path / "link"))


def test_no_symbolic_link_under_the_root_is_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret.txt"
    secret.write_bytes(b"not yours\n")
    storage = LocalStorage(str(tmp_path / "root"))
    (tmp_path / "root" / "files").mkdir()
    (tmp_path / "root" / "files" / "x").symlink_to(secret)
    (tmp_path / "root" / "linked").symlink_to(outside)

    for path in ("files/x", "linked/secret.txt"):
        with pytest.raises(UnsafePathError):
            storage.read(path)
        with pytest.raises(UnsafePathError):
            b"".join(storage.chunks(path))
        with pytest.raises(UnsafePathError):
            storage.size(path)
        with pytest.raises(UnsafePathError):
            storage.append(path, b"planted\n")
        with pytest.raises(UnsafePathError):
            storage.truncate(path, 0)
    with pytest.raises(UnsafePathError):
        storage.write("linked/new", b"x")
    with pytest.raises(UnsafePathError):
        storage.create("linked/new", b"x")
    with pytest.raises(UnsafePathError):
        storage.delete("linked/secret.txt")
    with pytest.raises(UnsafePathError):
        storage.names("linked")
    assert storage.names("files") == []  # the link is not a file of ours
    storage.delete("files/x")  # the link itself, not what it names
    assert secret.read_bytes() == b"not yours\n" and sorted(os.listdir(outside)) == ["secret.txt"]


@pytest.mark.parametrize("path", ["../outside/secret.txt", "files/../../outside/secret.txt", "/etc/passwd", "a//b"])
def test_a_path_that_leaves_the_root_is_refused(tmp_path, path):
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_bytes(b"not yours")
    storage = LocalStorage(str(tmp_path / "root"))
    with pytest.raises(UnsafePathError):
        storage.read(path)
    with pytest.raises(UnsafePathError):
        storage.write(path, b"x")
    with pytest.raises(UnsafePathError):
        storage.names(path)
    assert (tmp_path / "outside" / "secret.txt").read_bytes() == b"not yours"


def test_the_default_root_is_under_the_state_directory(tmp_path, monkeypatch):
    default = StateConfig().storage_root
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert isinstance(open_storage(default), LocalStorage)
    assert LocalStorage(default).root == tmp_path / "xdg" / "mmserve" / "storage"
    assert mode(tmp_path / "xdg" / "mmserve" / "storage") == 0o700

    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert LocalStorage(default).root == tmp_path / "home" / ".local" / "state" / "mmserve" / "storage"
