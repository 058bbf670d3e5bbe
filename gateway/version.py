"""The installed prefixgate's version (``prefixgate --version``, ``GET /version``, SARIF)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def gateway_version() -> str:
    try:
        return version("prefixgate")
    except PackageNotFoundError:
        return "unknown"
