"""The one table that maps policy names in config to their classes."""

from __future__ import annotations

from .base import Registry
from .least_load import LeastLoad
from .round_robin import RoundRobin


def default_registry() -> Registry:
    registry = Registry()
    registry.register(RoundRobin.name, RoundRobin.from_options)
    registry.register(LeastLoad.name, LeastLoad.from_options)
    return registry
