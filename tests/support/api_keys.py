"""Client key files for gateways started with ``api_keys`` (``gateway.auth.keys``)."""

from __future__ import annotations

import os
from pathlib import Path

import yaml


def write_keys(path: Path, entries: list[dict]) -> str:
    """Write ``entries`` as the key file at ``path`` in one step (a rename), as an
    operator's deploy would: the gateway's poll never reads half a file."""
    partial = path.with_suffix(".partial")
    partial.write_text(yaml.safe_dump(entries), encoding="utf-8")
    os.replace(partial, path)
    return str(path)
