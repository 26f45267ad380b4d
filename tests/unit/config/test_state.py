"""`server.state`: the storage root and the bounds of stored responses and conversations, with the
settings of earlier releases read into it (each move said in a warning)."""

from __future__ import annotations

import logging

import pytest
from pydantic import ValidationError

from deployments.config import ServerConfig, StateConfig


def test_the_defaults_keep_responses_a_gigabyte_for_thirty_days():
    state = ServerConfig().state
    assert state == StateConfig()
    assert state.responses_max_bytes == 1024**3 and state.responses_max_age_s == 30 * 24 * 3600
    assert state.storage_root == "$XDG_STATE_HOME/mmserve/storage"


def test_earlier_settings_are_read_into_the_state_section(caplog):
    old = {
        "batches": {"storage_root": "/srv/mmserve", "max_concurrency": 3},
        "responses_max_age_s": 120,
        "responses_max_entries": 50,
    }
    with caplog.at_level(logging.WARNING, logger="ray.serve"):
        server = ServerConfig.model_validate(old)
    assert server.state.storage_root == "/srv/mmserve" and server.state.responses_max_age_s == 120
    assert server.batches.max_concurrency == 3
    said = caplog.text
    assert "server.batches.storage_root is now server.state.storage_root" in said
    assert "server.responses_max_entries is no longer read" in said
    assert old["batches"] == {"storage_root": "/srv/mmserve", "max_concurrency": 3}  # the caller's mapping untouched


def test_the_new_place_wins_over_the_old():
    server = ServerConfig.model_validate({"state": {"storage_root": "/new"}, "batches": {"storage_root": "/old"}})
    assert server.state.storage_root == "/new"


@pytest.mark.parametrize("bad", [{"responses_max_bytes": -1}, {"responses_max_age_s": 0}, {"retention": 1}])
def test_bad_bounds_are_refused(bad):
    with pytest.raises(ValidationError):
        ServerConfig.model_validate({"state": bad})


def test_an_earlier_zero_entries_still_keeps_no_response():
    assert ServerConfig.model_validate({"responses_max_entries": 0}).state.responses_max_bytes == 0
    assert ServerConfig.model_validate({"responses_max_entries": 5}).state.responses_max_bytes == 1024**3
