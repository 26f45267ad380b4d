"""Stored state for unit tests: a store on a private temporary storage root of its own (removed when
the test process exits), as the ingress opens it on `server.state.storage_root`."""

from __future__ import annotations

import atexit
import shutil
import tempfile
import time
from collections.abc import Callable

from deployments.state.records import stored_owners
from deployments.state.responses import StoredResponses
from deployments.state.storage import LocalStorage


def temporary_storage() -> LocalStorage:
    root = tempfile.mkdtemp(prefix="mmserve-state-")  # 0700, this user's: what LocalStorage asks of a root
    atexit.register(shutil.rmtree, root, True)
    return LocalStorage(root)


def stored_responses(
    max_bytes: int = 1 << 24, max_age_s: float = 3600.0, clock: Callable[[], float] = time.time
) -> StoredResponses:
    storage = temporary_storage()
    return StoredResponses(storage, stored_owners(storage), max_bytes, max_age_s, clock)
