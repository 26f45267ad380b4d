"""The limits file (serve_config's `limits_file`): named API keys with their limits, and the default
for every other accepted key.

The keys themselves are never in the file: each named key is the value of an environment variable
of the ingress replica's process (`key_env`, as `MMSERVE_API_KEYS` is) or the SHA-256 digest of the
key (`key_sha256`, hex). A limit left out is unlimited. Read by the builder (a bad file fails the
deploy with the file and field named) and again by each ingress replica whenever the file changes
(`ingress/limits/table.py`: a bad edit is refused and the old limits stay).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import Field, ValidationError, model_validator

from deployments.config.loading import format_validation
from deployments.config.strict import StrictModel
from deployments.errors import ConfigError

DEFAULT_NAME = "default"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")  # a Prometheus label value, a log word


class KeyLimits(StrictModel):
    """What one key may do; None: unlimited."""

    requests_per_minute: Annotated[int, Field(gt=0)] | None = Field(
        None, description="Requests to a model's endpoint per minute (a token bucket of this size, refilled evenly)."
    )
    tokens_per_minute: Annotated[int, Field(gt=0)] | None = Field(
        None,
        description="Prompt plus completion tokens per minute. A request reserves its estimated prompt and its "
        "max_tokens when it is admitted, and is settled to the real count when it ends.",
    )
    max_concurrent: Annotated[int, Field(gt=0)] | None = Field(
        None, description="Requests of the key in flight at once, over every ingress replica."
    )
    models: list[str] | None = Field(
        None,
        description="The models the key may use (base names, or base:adapter for one adapter; a base name allows "
        "its adapters). Any other is answered as an unknown model (404 model_not_found). None: all.",
    )
    priority: int = Field(
        0,
        description="The decoders' admission order of the key's requests, as the request's `priority` (lower "
        "first); a request may ask for a later priority, never an earlier one.",
    )
    max_slot_share: Annotated[float, Field(gt=0, le=1)] | None = Field(
        None,
        description="The most of each decoder replica's max_num_seqs sequences (and of its KV pool, where the "
        "slots share one) the key's requests may hold at once (0.5: half; 1: all); the others wait. None: all but "
        "one sequence (a slot's worth of a shared pool) while the key has any running, kept for a key with none "
        "running, which takes it at once (docs/limits.md, 'Fair share in the decoders').",
    )


class NamedKey(KeyLimits):
    """A key of its own: the name its metrics and logs use, where the key is (an environment variable or its
    digest) and its limits.
    """

    name: str = Field(description="What metrics, logs and errors say; never the key.")
    key_env: str | None = Field(None, description="The environment variable that holds the key.")
    key_sha256: str | None = Field(None, description="The key's SHA-256 digest, 64 hex digits.")

    @model_validator(mode="after")
    def _one_key(self) -> NamedKey:
        if not _NAME.match(self.name) or self.name == DEFAULT_NAME:
            raise ValueError(
                f"name {self.name!r}: letters, digits, '.', '_' and '-', at most 63, and not {DEFAULT_NAME!r}"
            )
        if (self.key_env is None) == (self.key_sha256 is None):
            raise ValueError(f"key {self.name!r}: give exactly one of key_env and key_sha256")
        if self.key_sha256 is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", self.key_sha256):
            raise ValueError(f"key {self.name!r}: key_sha256 is 64 hex digits (sha256sum of the key)")
        return self


class LimitsFile(StrictModel):
    """The limits file as a whole: the default limits of every accepted key, and the named keys."""

    default: KeyLimits = Field(
        default_factory=KeyLimits, description="The limits of every accepted key without an entry of its own."
    )
    keys: list[NamedKey] = Field(default_factory=list, description="Named keys, each valid without MMSERVE_API_KEYS.")

    @model_validator(mode="after")
    def _unique(self) -> LimitsFile:
        names = [k.name for k in self.keys]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"key names appear twice: {', '.join(twice)}")
        return self

    def digests(self, environ: Mapping[str, str] = os.environ) -> dict[bytes, NamedKey]:
        """Each named key's SHA-256 digest; a `key_env` that is unset or empty is a `ConfigError`
        (a key that nobody could present is a mistake, not a key).
        """
        found: dict[bytes, NamedKey] = {}
        for key in self.keys:
            if key.key_sha256 is not None:
                digest = bytes.fromhex(key.key_sha256)
            else:
                value = environ.get(key.key_env or "", "").strip()
                if not value:
                    raise ConfigError(f"limits: key {key.name!r}: environment variable {key.key_env} is unset or empty")
                digest = hashlib.sha256(value.encode()).digest()
            if digest in found:
                raise ConfigError(f"limits: keys {found[digest].name!r} and {key.name!r} are the same key")
            found[digest] = key
        return found


def parse_limits(text: str, where: str) -> LimitsFile:
    """The limits file's text, validated; `ConfigError` naming `where` and the field otherwise."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML: {exc}") from None
    try:
        return LimitsFile.model_validate(raw if raw is not None else {})
    except ValidationError as exc:
        raise format_validation(where, exc) from None


def load_limits_file(path: str | Path) -> LimitsFile:
    """The limits file at `path`, validated; `ConfigError` when it cannot be read or is invalid."""
    path = Path(path).resolve()
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the limits file: {exc.strerror or exc}") from None
    return parse_limits(text, str(path))
