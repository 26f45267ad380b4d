"""The Files and Batch APIs' settings: the ``server.batches:`` section of models.yaml."""

from __future__ import annotations

from pydantic import Field

from deployments.config.strict import StrictModel


class BatchesConfig(StrictModel):
    """Where /v1/files keeps its files and /v1/batches its batches, their caps, and how fast the batch
    runner sends their lines (``server.batches:``)."""

    storage_root: str = Field(
        "$XDG_STATE_HOME/mmserve/storage",
        description="Where files, batches and their progress are kept: a local directory (a shared path on a "
        "cluster), or an `s3://` / `gs://` URI read and written through `pyarrow.fs` (pyarrow must then be "
        "installed). Every ingress replica and the batch runner reach it. A leading `$XDG_STATE_HOME` is that "
        "variable, or `~/.local/state` where it is unset (read when the storage opens, as is `~`). A local "
        "directory is private to the service's user: made 0700 (its files 0600); one that belongs to another "
        "user, is writable by others or is a symbolic link is refused at start.",
    )
    max_file_bytes: int = Field(100 * 1024 * 1024, gt=0, description="Largest file uploaded to /v1/files; 413 beyond.")
    max_files_per_key: int = Field(
        10_000,
        gt=0,
        description="Most files an API key keeps (all keys together when none are set), its batches' output "
        "and error files included; an upload past it is refused with a 400, as OpenAI refuses one past its "
        "storage quota (an expired or deleted file no longer counts).",
    )
    max_bytes_per_key: int = Field(
        10 * 1024**3,
        gt=0,
        description="Most bytes of files an API key keeps (all keys together when none are set), its batches' "
        "output and error files included; an upload that would pass it is refused with a 400 as it streams, "
        "as OpenAI refuses one past its storage quota.",
    )
    max_file_lines: int = Field(
        50_000, gt=0, description="Most lines (requests) of a batch input file; a batch over it fails at validation."
    )
    max_concurrency: int = Field(
        8,
        ge=1,
        le=1024,
        description="Lines the runner sends at once, over all running batches; Serve spreads them over the "
        "decoder replicas.",
    )
    poll_interval_s: float = Field(
        1.0, gt=0, description="How often the runner looks for new and cancelled batches in the storage root."
    )
    max_errors_reported: int = Field(
        100, ge=1, description="Most validation errors listed in a failed batch's `errors.data`."
    )
