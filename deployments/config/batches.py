"""The Files and Batch APIs' settings: the ``server.batches:`` section of models.yaml."""

from __future__ import annotations

from pydantic import Field

from deployments.config.strict import StrictModel


class BatchesConfig(StrictModel):
    """The caps of /v1/files and /v1/batches (kept in `server.state.storage_root`), and how fast the batch
    runner sends their lines (``server.batches:``).
    """

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
