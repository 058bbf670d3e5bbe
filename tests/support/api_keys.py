"""Client key files for gateways started with ``api_keys`` (``gateway.auth.keys``)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypedDict

import yaml


class KeyFileEntry(TypedDict, total=False):
    """One entry of a key file, the fields ``gateway.auth.keys.KeyEntry`` reads."""

    key: str
    key_sha256: str
    tenant: str
    admin: bool
    requests_per_minute: int
    tokens_per_minute: int
    max_concurrency: int


def write_keys(path: Path, entries: Sequence[Mapping[str, object]]) -> str:
    """Write ``entries`` (:class:`KeyFileEntry` values, or mappings built by spreading
    limits into one) as the key file at ``path`` in one step (a rename), as an operator's
    deploy would: the gateway's poll never reads half a file."""
    partial = path.with_suffix(".partial")
    partial.write_text(yaml.safe_dump([dict(entry) for entry in entries]), encoding="utf-8")
    os.replace(partial, path)
    return str(path)
