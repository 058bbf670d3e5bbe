"""The one table that maps policy names in config to their classes.

Policies that age state (``prefix``, ``precise``) need the clock the gateway
hands them: build the registry with ``default_registry(clock=time.monotonic)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from policies.base import Policy, Registry
from policies.chwbl import Chwbl
from policies.least_load import LeastLoad
from policies.precise import NAME as PRECISE
from policies.precise import precise_policy
from policies.prefix import NAME as PREFIX
from policies.prefix import prefix_policy
from policies.round_robin import RoundRobin


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
        return prefix_policy(options, clock=needs_clock(PREFIX))

    def precise(options: Mapping[str, Any]) -> Policy:
        return precise_policy(options, clock=needs_clock(PRECISE))

    registry.register(PREFIX, prefix)
    registry.register(PRECISE, precise)
    return registry
