"""The ops view of a gateway of several workers: their readings, as one gateway's.

With ``--workers N`` each worker's ops sampler (``gateway.ops.sampler``) asks the
supervisor's hub for every worker's readings (``gateway.fleet.local``) every
sample: each worker reads its own registry as a one-process gateway does
(:func:`local_readings`) and sends them compact (:func:`encode_readings`, a
few hundred bytes a replica, no Prometheus text to write or parse), and the
asking worker adds them up (:func:`merge_readings`): the gateway's own counts
and histograms (requests, tokens, its TTFT, its CPU and loop lag, requests
open and preparing) are summed; what each worker read from a replica (its
health, running and waiting requests, KV usage, its prefix-cache and
generation counters, its engine-side histograms) is the same replica seen N
times, so the largest (the freshest) counts.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgpack
from prometheus_client import CollectorRegistry

from gateway.ops.load import LOAD_SERIES, LoadReading, read_load
from gateway.ops.stats import (
    FROM_THE_REPLICA,
    REGISTRY_SERIES,
    ReplicaReading,
    Totals,
    read_registry,
)

Readings = tuple[list[ReplicaReading], LoadReading]

READ_SERIES = frozenset({*REGISTRY_SERIES, *LOAD_SERIES})
"""Every series a reading reads: the sampler collects these and no other (a full
collection of the registry, every histogram and label set of the gateway's own
metrics, held the serving loop ~2 ms every sample; these, about half that)."""


def local_readings(registry: CollectorRegistry, replica_ids: Iterable[str]) -> Readings:
    """This process's readings, from one collection of the series they read."""
    collected = list(registry.restricted_registry(READ_SERIES).collect())
    return read_registry(collected, replica_ids), read_load(collected)


def _totals(totals: Totals) -> list[Any]:
    return [dict(totals.counters),
            {name: [list(pair) for pair in buckets]
             for name, buckets in totals.histograms.items()}]


def encode_readings(readings: Readings) -> bytes:
    replicas, load = readings
    return msgpack.packb({
        "replicas": [[r.replica_id, r.healthy, r.inflight, r.running, r.waiting, r.kv_usage,
                      *_totals(r.raw)] for r in replicas],
        "load": [*_totals(load.totals), load.preparing, load.open, load.lint_queue],
    })


def _put(into: dict[Any, float], key: Any, value: float, from_the_replica: bool) -> None:
    """One worker's figure into the gateway's: added, or, for what the replica itself
    counts, the largest (the freshest)."""
    if key not in into:
        into[key] = value
    elif from_the_replica:
        into[key] = max(into[key], value)
    else:
        into[key] += value


class _Sum:
    def __init__(self) -> None:
        self.counters: dict[str, float] = {}
        self.buckets: dict[str, dict[float, float]] = {}

    def add(self, counters: dict[str, float], histograms: dict[str, list[list[float]]],
            replica: bool) -> None:
        for key, value in counters.items():
            _put(self.counters, key, value, replica and key in FROM_THE_REPLICA)
        for name, pairs in histograms.items():
            buckets = self.buckets.setdefault(name, {})
            for le, count in pairs:
                _put(buckets, le, count, replica and name in FROM_THE_REPLICA)

    def totals(self) -> Totals:
        return Totals(self.counters, {name: tuple(sorted(per_le.items()))
                                      for name, per_le in self.buckets.items()})


def merge_readings(payloads: Iterable[bytes]) -> Readings:
    """Several workers' readings (:func:`encode_readings`) as one gateway's."""
    replicas: dict[str, dict[str, Any]] = {}
    load, preparing, open_, lint = _Sum(), 0, 0, None
    for payload in payloads:
        data = msgpack.unpackb(payload, strict_map_key=False)
        for ident, healthy, inflight, running, waiting, kv_usage, counters, hists \
                in data["replicas"]:
            seen = replicas.setdefault(ident, {"healthy": False, "inflight": 0, "running": 0,
                                               "waiting": 0, "kv_usage": 0.0, "sum": _Sum()})
            seen["healthy"] = seen["healthy"] or healthy
            seen["inflight"] += inflight  # each worker's own requests there
            seen["running"] = max(seen["running"], running)
            seen["waiting"] = max(seen["waiting"], waiting)
            seen["kv_usage"] = max(seen["kv_usage"], kv_usage)
            seen["sum"].add(counters, hists, replica=True)
        counters, hists, worker_preparing, worker_open, worker_lint = data["load"]
        load.add(counters, hists, replica=False)
        preparing += worker_preparing
        open_ += worker_open
        if worker_lint is not None:
            lint = (lint or 0) + worker_lint
    return ([ReplicaReading(ident, healthy=r["healthy"], inflight=r["inflight"],
                            running=r["running"], waiting=r["waiting"],
                            kv_usage=r["kv_usage"], raw=r["sum"].totals())
             for ident, r in replicas.items()],
            LoadReading(load.totals(), preparing=preparing, open=open_, lint_queue=lint))
