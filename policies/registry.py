"""The one table that maps policy names in config to their classes.

Policies that age state (``prefix``, ``precise``) need the clock the gateway
hands them: build the registry with ``default_registry(clock=time.monotonic)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .base import Policy, Registry
from .chwbl import Chwbl
from .least_load import LeastLoad
from .precise import PrecisePolicy
from .prefix import PrefixPolicy
from .round_robin import RoundRobin


def default_registry(clock: Callable[[], float] | None = None) -> Registry:
    registry = Registry()
    registry.register(RoundRobin.name, RoundRobin.from_options)
    registry.register(LeastLoad.name, LeastLoad.from_options)
    registry.register(Chwbl.name, Chwbl.from_options)

    def needs_clock(name: str) -> Callable[[], float]:
        if clock is None:
            raise ValueError(
                f"policy {name!r} needs a clock: build the registry with "
                "default_registry(clock=time.monotonic)"
            )
        return clock

    def prefix(options: Mapping[str, Any]) -> Policy:
        return PrefixPolicy.from_options(options, clock=needs_clock(PrefixPolicy.name))

    def precise(options: Mapping[str, Any]) -> Policy:
        return PrecisePolicy.from_options(options, clock=needs_clock(PrecisePolicy.name))

    registry.register(PrefixPolicy.name, prefix)
    registry.register(PrecisePolicy.name, precise)
    return registry
