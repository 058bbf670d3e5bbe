"""Strict parsing of a policy's options into its typed config dataclass."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def parse_options(config_cls: type[T], options: Mapping[str, Any], policy: str) -> T:
    """Build ``config_cls`` from ``options``; unknown keys and bad types are errors."""
    fields = {f.name: f for f in dataclasses.fields(config_cls)}  # type: ignore[arg-type]
    unknown = sorted(set(options) - set(fields))
    if unknown:
        raise ValueError(
            f"policy {policy!r}: unknown option(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(fields)) or 'none'}"
        )
    values: dict[str, Any] = {}
    for name, value in options.items():
        default = fields[name].default
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise ValueError(f"policy {policy!r}: option {name} must be true or false")  # noqa: TRY004 (a config error)
        elif isinstance(default, (int, float)) and not isinstance(value, bool):
            if not isinstance(value, (int, float)):
                raise ValueError(f"policy {policy!r}: option {name} must be a number")  # noqa: TRY004
            value = type(default)(value)
        values[name] = value
    return config_cls(**values)
