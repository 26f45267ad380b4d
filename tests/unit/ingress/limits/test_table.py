"""The limits file: parsing, keys from digests and environment variables, identities, and reloads."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import pytest

from deployments.config.limits import load_limits_file, parse_limits
from deployments.errors import ConfigError
from deployments.ingress.limits import table as table_module
from deployments.ingress.limits.table import KeyTable

KEY_A, KEY_B = "sk-team-a-0123456789", "sk-team-b-9876543210"
FILE = f"""
default:
  requests_per_minute: 600
  max_concurrent: 16
keys:
  - name: team-a
    key_env: TEAM_A_KEY
    requests_per_minute: 60
    tokens_per_minute: 20000
    models: [smollm2-135m-instruct]
    priority: 1
    max_slot_share: 0.5
  - name: team-b
    key_sha256: {hashlib.sha256(KEY_B.encode()).hexdigest()}
"""


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "limits.yaml"
    path.write_text(text)
    return path


def test_named_keys_come_from_the_environment_or_a_digest(tmp_path: Path) -> None:
    path = write(tmp_path, FILE)
    table = KeyTable(load_limits_file(path), str(path), environ={"TEAM_A_KEY": KEY_A})
    assert set(table.digests) == {digest(KEY_A), digest(KEY_B)}
    a = table.identify(digest(KEY_A))
    assert (a.name, a.queue, a.caps.requests_per_minute, a.caps.tokens_per_minute) == ("team-a", "team-a", 60, 20000)
    assert a.tenant.priority == 1 and a.tenant.share == 0.5
    b = table.identify(digest(KEY_B))
    assert b.name == "team-b" and b.caps.requests_per_minute is None  # left out: unlimited
    other, other2 = table.identify(digest("sk-another")), table.identify(digest("sk-yet-another"))
    assert other.name == other2.name == "default" and other.caps.max_concurrent == 16
    assert other.queue != other2.queue  # keys sharing the default entry still queue apart
    assert table.identify(None).queue == "default"


def test_the_model_list_allows_a_base_and_its_adapters_only(tmp_path: Path) -> None:
    table = KeyTable(parse_limits(FILE, "f"), None, environ={"TEAM_A_KEY": KEY_A})
    a = table.identify(digest(KEY_A))
    assert a.allows("smollm2-135m-instruct") and a.allows("smollm2-135m-instruct:sql")
    assert not a.allows("qwen2-0.5b") and table.identify(digest(KEY_B)).allows("qwen2-0.5b")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("keys: [{name: a, key_env: X, key_sha256: " + "a" * 64 + "}]", "exactly one of key_env and key_sha256"),
        ("keys: [{name: a, key_sha256: abc}]", "64 hex digits"),
        ("keys: [{name: a, key_env: X}, {name: a, key_env: Y}]", "appear twice"),
        ("keys: [{name: default, key_env: X}]", "not 'default'"),
        ("default: {requests_per_minute: 0}", "default.requests_per_minute"),
        ("default: {rpm: 5}", "default.rpm"),
        ("keys: [{name: a, key_env: X, max_slot_share: 1.5}]", "max_slot_share"),
        ("default: [", "not valid YAML"),
    ],
)
def test_a_bad_file_is_refused_naming_the_field(text: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words.replace("[", r"\[").replace(".", r"\.")):
        parse_limits(text, "limits.yaml")


def test_a_key_env_that_is_unset_is_an_error_not_a_key() -> None:
    with pytest.raises(ConfigError, match="TEAM_A_KEY is unset"):
        parse_limits(FILE, "f").digests(environ={})


def test_an_edit_takes_effect_and_a_bad_edit_keeps_the_old_limits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(table_module, "CHECK_EVERY_S", 0.0)
    path = write(tmp_path, FILE)
    table = KeyTable(load_limits_file(path), str(path), environ={"TEAM_A_KEY": KEY_A})
    path.write_text(FILE.replace("requests_per_minute: 60", "requests_per_minute: 5"))
    os.utime(path, ns=(1, 1))  # a new time even within the file system's time resolution
    assert table.identify(digest(KEY_A)).caps.requests_per_minute == 5
    with caplog.at_level(logging.ERROR, logger="ray.serve"):
        path.write_text("keys: [{name: team-a}]")
        os.utime(path, ns=(2, 2))
        assert table.identify(digest(KEY_A)).caps.requests_per_minute == 5
    assert "edit refused, the limits before it stay" in caplog.text
    path.write_text(FILE.replace("name: team-b", "name: team-c"))
    os.utime(path, ns=(3, 3))
    assert table.identify(digest(KEY_B)).name == "team-c"


def test_a_file_not_on_this_node_keeps_the_builders_limits(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="ray.serve"):
        table = KeyTable(parse_limits(FILE, "f"), "/nonexistent/limits.yaml", environ={"TEAM_A_KEY": KEY_A})
    assert "not on this node" in caplog.text
    assert table.identify(digest(KEY_A)).name == "team-a"
