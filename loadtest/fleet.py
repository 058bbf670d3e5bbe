"""The replicas a comparison runs against: ``--replicas KIND:N``.

* ``sim:N`` -- N simulated replicas (:mod:`.sims`, wrapped here by
  :class:`SimFleet`);
* ``vllm-cpu:N`` -- N real vLLM-on-CPU servers (:mod:`.vllm_fleet`).

Both kinds give :func:`loadtest.compare.compare` the same things, the
:class:`Fleet` protocol: :meth:`Fleet.start` returns the replicas as the
contenders see them (:class:`loadtest.sims.SimReplica`: id, URL, block size,
KV-event ports) plus a way to empty every replica's prefix cache between
contenders; and the served model name, its tokenizer folder and the cache
geometry (block size, total blocks) that the ideal bound replays.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from loadtest.processes import ServiceGroup
from loadtest.sims import SimFleetSpec, SimReplica, reset_caches, start_sims

REPLICA_KINDS = ("sim", "vllm-cpu")


@dataclass(frozen=True, slots=True)
class ReplicaChoice:
    """What ``--replicas`` asked for: the kind of replica and how many."""

    kind: str
    count: int


def parse_replicas(text: str) -> ReplicaChoice:
    """``sim:4`` -> ReplicaChoice("sim", 4); ``vllm-cpu:2`` -> ReplicaChoice("vllm-cpu", 2)."""
    kind, sep, count = text.strip().partition(":")
    if kind not in REPLICA_KINDS or not sep or not count.isdigit() or int(count) < 1:
        raise ValueError(f"--replicas must be sim:N or vllm-cpu:N with N >= 1, got {text!r}")
    return ReplicaChoice(kind, int(count))


@dataclass(frozen=True)
class StartedFleet:
    replicas: tuple[SimReplica, ...]
    reset: Callable[[], None]
    """Empties every replica's prefix cache (called with no request in flight)."""


class Fleet(Protocol):
    @property
    def model(self) -> str:
        """The served model name the workload asks for."""

    @property
    def block_size(self) -> int: ...

    def capacity_blocks(self) -> int:
        """KV blocks of all replicas together: the ideal replica's capacity."""

    def tokenizer_path(self) -> str | None: ...

    def with_kv_events(self) -> Fleet:
        """The same fleet with KV-event publishing on."""

    def start(self, stack: contextlib.ExitStack[bool | None], log_dir: Path) -> StartedFleet:
        """Start every replica; they stop when ``stack`` closes."""

    def label(self) -> str:
        """For the report title, e.g. ``4 sims``."""

    def describe(self) -> dict[str, object]:
        """The replicas' settings, for the report's metadata."""


@dataclass(frozen=True)
class SimFleet:
    """:class:`Fleet` over simulated replicas."""

    spec: SimFleetSpec

    @property
    def model(self) -> str:
        return self.spec.model

    @property
    def block_size(self) -> int:
        return self.spec.block_size

    def capacity_blocks(self) -> int:
        return self.spec.num_blocks * self.spec.count

    def tokenizer_path(self) -> str | None:
        return self.spec.tokenizer_path()

    def with_kv_events(self) -> SimFleet:
        return SimFleet(dataclasses.replace(self.spec, kv_events=True))

    def start(self, stack: contextlib.ExitStack[bool | None], log_dir: Path) -> StartedFleet:
        replicas = tuple(start_sims(self.spec, stack.enter_context(ServiceGroup()), log_dir))
        return StartedFleet(replicas, lambda: reset_caches(list(replicas)))

    def label(self) -> str:
        return f"{self.spec.count} sims"

    def describe(self) -> dict[str, object]:
        spec = self.spec
        return {"kind": "sim", "count": spec.count, "num_blocks": spec.num_blocks,
                "block_size": spec.block_size, "time_scale": spec.time_scale,
                "seed": spec.seed, "extra_args": list(spec.extra_args),
                "tokenizer": spec.tokenizer_path()}
