"""Stored files on a shared host: each key's quotas (files, bytes), OpenAI's `expires_after` (an
expired file is not found and its bytes are gone), a batch's `metadata` within OpenAI's bounds, lists
that read only the caller's records (its index), and an upload streamed to the storage root as it
arrives, never held whole."""

from __future__ import annotations

import shutil
import time
import types
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from deployments.config import BatchesConfig, ServerConfig
from deployments.errors import InvalidRequestError, ObjectNotFoundError
from deployments.ingress.api import build_api
from deployments.ingress.guard import GuardSettings
from deployments.ingress.health import HealthService
from deployments.ingress.served_models import ServedModel, ServedModels
from deployments.protocol.openai.batches import BatchCreateRequest
from deployments.protocol.openai.models import ModelCard
from deployments.state import files as files_module
from deployments.state.batches import BatchStore
from deployments.state.files import BATCH_FILE_EXPIRY_S, ExpiresAfter, data_path
from deployments.state.owners import Caller
from deployments.state.storage import CHUNK_BYTES, LocalStorage
from tests.unit.fake_metrics import FakeMetrics
from tests.unit.ingress.fakes import FakeDecoder, answer_core

ALICE, BOB = Caller(b"a" * 32), Caller(b"b" * 32)
KEY_A, KEY_B = "sk-alice-0123456", "sk-bob-012345678"
CHAT = "/v1/chat/completions"
BOUNDARY = "limits-boundary"


class RecordingStorage:
    """A local root that notes every path read and the size of every chunk written (a fake storage
    for the tests' eyes; `sent` says how much of the request body the client had sent at each chunk)."""

    def __init__(self, root: Path) -> None:
        self._local = LocalStorage(str(root))
        self.reads: list[str] = []
        self.chunks_written: list[tuple[int, int]] = []  # (chunk size, body bytes sent by then)
        self.sent = 0

    def read(self, path: str) -> bytes | None:
        self.reads.append(path)
        return self._local.read(path)

    def write(self, path: str, data: bytes | Iterable[bytes]) -> None:
        def noted(chunks: Iterable[bytes]) -> Iterator[bytes]:
            for chunk in chunks:
                self.chunks_written.append((len(chunk), self.sent))
                yield chunk

        self._local.write(path, data if isinstance(data, bytes) else noted(data))

    def append(self, path: str, data: bytes) -> None:
        self._local.append(path, data)

    def chunks(self, path: str) -> Iterator[bytes]:
        self.reads.append(path)
        return self._local.chunks(path)

    def size(self, path: str) -> int | None:
        return self._local.size(path)

    def truncate(self, path: str, size: int) -> None:
        self._local.truncate(path, size)

    def create(self, path: str, data: bytes) -> bool:
        return self._local.create(path, data)

    def delete(self, path: str) -> None:
        self._local.delete(path)

    def names(self, directory: str) -> list[str]:
        return self._local.names(directory)


def store(root: Path, **batches: Any) -> tuple[BatchStore, RecordingStorage]:
    storage = RecordingStorage(root)
    return BatchStore.open(BatchesConfig(**batches), storage), storage


def app(batches: BatchStore, keys: tuple[str, ...] = (KEY_A, KEY_B)) -> httpx.AsyncClient:
    """The ingress's app (guard and error mapping included) with `keys`, over `batches`."""
    served = ServedModels([ServedModel(ModelCard(id="echo", created=1), answer_core(FakeDecoder()), _health())])
    guard = GuardSettings.from_config(ServerConfig(api_keys=list(keys), api_keys_env=None))
    api = build_api(served, guard, FakeMetrics(), batch_service=batches)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://test")


def _health() -> HealthService:
    return HealthService(FakeDecoder(), None, model_name="echo")


def form(fields: dict[str, str], data: bytes, *, file_first: bool = False) -> bytes:
    """A multipart/form-data body: `fields`, and `data` as its `file` part (after them, or before)."""
    parts = [
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        for name, value in fields.items()
    ]
    file = (
        (
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        + data
        + b"\r\n"
    )
    parts.insert(0 if file_first else len(parts), file)
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


HEADERS = {"content-type": f"multipart/form-data; boundary={BOUNDARY}"}


def auth(key: str) -> dict[str, str]:
    return {**HEADERS, "authorization": f"Bearer {key}"}


# -- quotas -------------------------------------------------------------------------------------


def test_a_key_past_its_file_count_is_refused_while_another_key_uploads(tmp_path):
    batches, _ = store(tmp_path, max_files_per_key=2)
    files = batches.files
    kept = [files.create("a", b"x", "user_data", ALICE) for _ in range(2)]
    with pytest.raises(InvalidRequestError, match="file quota") as refused:
        files.create("a", b"x", "user_data", ALICE)
    assert refused.value.status == 400 and refused.value.param == "file"
    assert files.create("b", b"y", "user_data", BOB)["bytes"] == 1  # Bob's quota is his own
    files.delete(kept[0]["id"], ALICE)  # a deleted file no longer counts
    assert files.create("a", b"x", "user_data", ALICE)["bytes"] == 1
    assert len(files.storage.names("file-data")) == 3


def test_a_key_past_its_bytes_is_refused_as_the_upload_streams(tmp_path):
    batches, _ = store(tmp_path, max_bytes_per_key=100)
    files = batches.files
    files.create("a", b"x" * 60, "user_data", ALICE)
    with pytest.raises(InvalidRequestError, match="storage quota"):
        files.create("a", iter([b"x" * 30, b"x" * 30]), "user_data", ALICE)  # 120 > 100, refused as it passes
    assert len(files.storage.names("file-data")) == 1  # nothing kept of the refused one
    assert files.create("b", b"y" * 90, "user_data", BOB)["bytes"] == 90
    assert files.create("a", b"x" * 40, "user_data", ALICE)["bytes"] == 40  # exactly up to the quota


async def test_over_quota_is_openais_400_over_http_and_another_key_still_uploads(tmp_path):
    batches, _ = store(tmp_path, max_files_per_key=1)
    async with app(batches) as http:
        first = await http.post("/v1/files", content=form({"purpose": "user_data"}, b"a\n"), headers=auth(KEY_A))
        assert first.status_code == 200, first.text
        again = await http.post("/v1/files", content=form({"purpose": "user_data"}, b"a\n"), headers=auth(KEY_A))
        assert again.status_code == 400
        error = again.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == "file" and "quota" in error["message"]
        other = await http.post("/v1/files", content=form({"purpose": "user_data"}, b"b\n"), headers=auth(KEY_B))
        assert other.status_code == 200


# -- expiry -------------------------------------------------------------------------------------


async def test_expires_after_within_openais_bounds_sets_expires_at_and_outside_is_400(tmp_path):
    batches, _ = store(tmp_path)
    async with app(batches) as http:
        for seconds, anchor, status, param in [
            ("3600", "created_at", 200, None),
            ("2592000", "created_at", 200, None),
            ("3599", "created_at", 400, "expires_after[seconds]"),
            ("2592001", "created_at", 400, "expires_after[seconds]"),
            ("soon", "created_at", 400, "expires_after[seconds]"),
            ("3600", "last_active_at", 400, "expires_after[anchor]"),
            ("3600", None, 200, None),  # created_at, the only anchor, may be left out
            (None, "created_at", 400, "expires_after[seconds]"),  # an anchor alone says no time
        ]:
            given = {"expires_after[anchor]": anchor, "expires_after[seconds]": seconds}
            fields = {"purpose": "user_data", **{k: v for k, v in given.items() if v is not None}}
            answer = await http.post("/v1/files", content=form(fields, b"a\n"), headers=auth(KEY_A))
            assert answer.status_code == status, (seconds, anchor, answer.text)
            if status == 200:
                shown = answer.json()
                assert shown["expires_at"] == shown["created_at"] + int(seconds or 0)
            else:
                assert answer.json()["error"]["param"] == param
        # the fields after the file (as some clients send them) are read as well
        late = await http.post(
            "/v1/files",
            content=form(
                {"purpose": "user_data", "expires_after[anchor]": "created_at", "expires_after[seconds]": "7200"},
                b"z",
                file_first=True,
            ),
            headers=auth(KEY_A),
        )
        assert late.status_code == 200 and late.json()["expires_at"] == late.json()["created_at"] + 7200
    assert len(batches.files.storage.names("file-data")) == 4  # nothing kept of the refused ones


def test_a_batch_file_expires_after_30_days_by_default_and_others_never(tmp_path):
    files = store(tmp_path)[0].files
    batch = files.create("in.jsonl", b"{}\n", "batch", ALICE)
    assert batch["expires_at"] == batch["created_at"] + BATCH_FILE_EXPIRY_S
    assert files.create("notes", b"n", "user_data", ALICE)["expires_at"] is None
    with pytest.raises(InvalidRequestError):
        ExpiresAfter.parse("created_at", None)


def later(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """The files' clock moved `seconds` on."""
    now = time.time() + seconds
    monkeypatch.setattr(files_module, "time", types.SimpleNamespace(time=lambda: now, monotonic=time.monotonic))


def test_an_expired_file_is_not_found_and_its_bytes_and_record_are_gone(tmp_path, monkeypatch):
    batches, storage = store(tmp_path)
    files = batches.files
    hour = ExpiresAfter("created_at", 3600)
    short = files.create("in.jsonl", b"{}\n", "batch", ALICE, hour)
    never = files.create("mine", b"m", "user_data", BOB, hour)  # nobody reads it again: the sweep removes it
    kept = files.create("kept", b"k", "user_data", BOB)
    later(monkeypatch, 3601)
    for reach in (
        lambda: files.retrieve(short["id"], ALICE),
        lambda: files.content(short["id"], ALICE),
        lambda: files.delete(short["id"], ALICE),
        lambda: batches.create(BatchCreateRequest(input_file_id=short["id"], endpoint=CHAT).new_batch(), ALICE),
    ):
        with pytest.raises(ObjectNotFoundError):
            reach()
    assert storage.size(data_path(short["id"])) is None and files.records.load(short["id"]) is None
    assert files.list(ALICE, None, 100, None, "desc")["data"] == []
    assert storage.size(data_path(never["id"])) == 1
    assert files.sweep() == 1
    assert storage.size(data_path(never["id"])) is None and files.records.load(never["id"]) is None
    assert [f["id"] for f in files.list(BOB, None, 100, None, "desc")["data"]] == [kept["id"]]
    assert storage.names("index/expiry") == []


# -- batch metadata ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "metadata",
    [
        {f"k{i}": "v" for i in range(17)},  # 17 pairs
        {"k" * 65: "v"},  # a key of 65 characters
        {"k": "v" * 513},  # a value of 513 characters
        {"k": 5},  # not a string
    ],
)
async def test_batch_metadata_past_openais_bounds_is_a_400_naming_metadata(tmp_path, metadata):
    batches, _ = store(tmp_path)
    source = batches.files.create("in.jsonl", b"{}\n", "batch", Caller(None))
    async with app(batches, keys=()) as http:
        body = {"input_file_id": source["id"], "endpoint": CHAT, "metadata": metadata}
        answer = await http.post("/v1/batches", json=body)
    assert answer.status_code == 400
    assert answer.json()["error"]["param"].startswith("metadata")


def test_batch_metadata_up_to_openais_bounds_is_kept():
    metadata = {f"{i:02d}" + "k" * 62: "v" * 512 for i in range(16)}
    assert BatchCreateRequest(input_file_id="f", endpoint=CHAT, metadata=metadata).metadata == metadata


# -- lists read only the caller's records -------------------------------------------------------


def test_a_list_reads_only_the_callers_records(tmp_path):
    batches, storage = store(tmp_path)
    files = batches.files
    mine = [files.create("a", b"{}\n", "batch", ALICE) for _ in range(3)]
    theirs = [files.create("b", b"{}\n", "batch", BOB) for _ in range(3)]
    my_batch = batches.create(BatchCreateRequest(input_file_id=mine[0]["id"], endpoint=CHAT).new_batch(), ALICE)
    their_batch = batches.create(BatchCreateRequest(input_file_id=theirs[0]["id"], endpoint=CHAT).new_batch(), BOB)
    storage.reads.clear()
    assert {f["id"] for f in files.list(ALICE, None, 100, None, "desc")["data"]} == {f["id"] for f in mine}
    assert [b["id"] for b in batches.list(ALICE, 20, None)["data"]] == [my_batch["id"]]
    theirs_ids = {f["id"] for f in theirs} | {their_batch["id"]}
    assert storage.reads and not [path for path in storage.reads if any(i in path for i in theirs_ids)]


def test_a_root_written_before_the_index_is_indexed_when_opened(tmp_path):
    batches, _ = store(tmp_path)
    kept = batches.files.create("a", b"{}\n", "batch", ALICE)
    batch = batches.create(BatchCreateRequest(input_file_id=kept["id"], endpoint=CHAT).new_batch(), ALICE)
    shutil.rmtree(tmp_path / "index")  # as a root of the previous release has it
    again, _ = store(tmp_path)
    assert [f["id"] for f in again.files.list(ALICE, None, 100, None, "desc")["data"]] == [kept["id"]]
    assert [b["id"] for b in again.list(ALICE, 20, None)["data"]] == [batch["id"]]
    assert again.files.list(BOB, None, 100, None, "desc")["data"] == []


# -- uploads streamed ---------------------------------------------------------------------------


@pytest.mark.parametrize("file_first", [False, True])
async def test_an_upload_goes_to_storage_a_chunk_at_a_time_as_it_arrives(tmp_path, file_first):
    batches, storage = store(tmp_path)
    line = b'{"custom_id": "x", "method": "POST", "url": "/v1/embeddings", "body": {}}\n'
    data = line * (4 * 1024 * 1024 // len(line))  # about 4 MiB
    body = form({"purpose": "user_data"}, data, file_first=file_first)

    async def sent_in_pieces() -> AsyncIterator[bytes]:
        for at in range(0, len(body), 256 * 1024):
            storage.sent = at + len(body[at : at + 256 * 1024])
            yield body[at : at + 256 * 1024]

    async with app(batches, keys=()) as http:  # the whole ingress app: its guard holds no upload either
        answer = await http.post("/v1/files", content=sent_in_pieces(), headers=HEADERS)
    assert answer.status_code == 200, answer.text
    assert answer.json()["bytes"] == len(data)
    sizes = [size for size, _ in storage.chunks_written]
    assert sum(sizes) == len(data) and max(sizes) <= CHUNK_BYTES
    assert storage.chunks_written[0][1] < len(body) // 2  # written while most of the body was still to come
    assert b"".join(batches.files.content(answer.json()["id"], Caller(None))) == data


async def test_a_field_given_twice_is_refused(tmp_path):
    batches, storage = store(tmp_path)
    twice = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'.encode()
    body = twice + form({"purpose": "user_data"}, b"a\n")
    async with app(batches, keys=()) as http:
        answer = await http.post("/v1/files", content=body, headers=HEADERS)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "purpose", answer.text
    assert storage.names("file-data") == []


async def test_a_refused_form_keeps_nothing(tmp_path):
    batches, storage = store(tmp_path, max_file_bytes=1000)
    async with app(batches, keys=()) as http:
        late_purpose = form({"purpose": "fine-tune"}, b"{}\n", file_first=True)
        too_big = form({"purpose": "user_data"}, b"x" * 1001)
        for body, status in [(late_purpose, 400), (too_big, 413), (b"--nothing", 400)]:
            answer = await http.post("/v1/files", content=body, headers=HEADERS)
            assert answer.status_code == status, answer.text
    assert storage.names("file-data") == [] and storage.names("files") == []
