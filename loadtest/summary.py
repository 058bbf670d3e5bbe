"""Figures of a measured run: latency percentiles, throughput, hit rate, balance.

* Latencies (TTFT, TPOT, end-to-end) are over successful requests, in
  seconds, percentiles by linear interpolation between order statistics.
* ``throughput_rps``: successful requests per second of the run's wall time
  (first send to last answer); ``output_tps`` the same for generated tokens.
* ``hit_rate``: replica-side, summed prefix-cache hit tokens over queried
  tokens across all replicas (see :mod:`.replica_metrics`);
  ``client_cached_ratio``: the same seen from the client,
  ``sum(cached_tokens) / sum(prompt_tokens)`` from the usage chunks.
* Balance: ``load_mean`` per replica is its time-averaged running + waiting
  requests; ``max_mean_load`` is the largest over the mean of those (1.0 =
  perfectly even, 4.0 = everything on one of four replicas).
  ``requests`` per replica comes from the replicas' own counters;
  ``requests_by_header`` from ``x-prefixgate-replica`` when present.
* ``predicted_ratio``: what the gateway predicted the replicas would find
  cached (``x-prefixgate-matched-tokens``) over what they reported
  (``cached_tokens``), summed over requests with both (prefixgate only).
* Bursts (the ``burst`` workload): ``bursts`` is, per burst, the requests
  each replica served between that burst's first send and the next burst's
  (the replicas' own counters, sampled); ``burst_max_mean`` the worst
  per-burst busiest replica over the mean. ``ejections``: breaker openings
  of the gateway's replicas during the run (prefixgate only).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from loadtest.measure import MeasuredRun
from loadtest.workloads.burst import GROUP_PREFIX as BURST_GROUP


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) by linear interpolation; ``None`` if empty."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class Latency:
    p50: float | None
    p90: float | None
    p99: float | None
    mean: float | None

    @classmethod
    def of(cls, values: Sequence[float]) -> Latency:
        return cls(percentile(values, 50), percentile(values, 90), percentile(values, 99),
                   sum(values) / len(values) if values else None)


@dataclass(frozen=True)
class ReplicaFigures:
    url: str
    requests: float
    hit_rate: float | None
    prefix_hits: float
    prefix_queries: float
    load_mean: float | None
    load_max: float | None


@dataclass(frozen=True)
class RunSummary:
    label: str
    workload: str
    requests: int
    ok: int
    errors: int
    unsent: int
    abandoned: int
    duration_s: float
    throughput_rps: float
    output_tps: float
    ttft: Latency
    tpot: Latency
    e2e: Latency
    hit_rate: float | None
    client_cached_ratio: float | None
    max_mean_load: float | None
    replicas: list[ReplicaFigures]
    requests_by_header: dict[str, int] = field(default_factory=dict)
    error_kinds: dict[str, int] = field(default_factory=dict)
    predicted_ratio: float | None = None
    ejections: float | None = None
    bursts: list[list[int]] = field(default_factory=list)
    burst_max_mean: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(run: MeasuredRun) -> RunSummary:
    records = run.drive.records
    good = [r for r in records if r.ok]
    ttft = [r.ttft for r in good if r.ttft is not None]
    tpot = [r.tpot for r in good if r.tpot is not None]
    e2e = [r.e2e for r in good if r.e2e is not None]
    if good:
        first = min(r.sent_at for r in good)
        last = max(r.sent_at + (r.e2e or 0.0) for r in good)
        span = max(last - first, 1e-9)
    else:
        span = run.drive.duration
    output_tokens = sum(r.completion_tokens or 0 for r in good)
    prompt_tokens = sum(r.prompt_tokens or 0 for r in good if r.usage_reported)
    cached = sum(r.cached_tokens or 0 for r in good if r.usage_reported)
    any_cached = any(r.cached_tokens is not None for r in good)

    replicas = []
    for index, delta in enumerate(run.replicas):
        loads = [s.load[index] for s in run.load if not math.isnan(s.load[index])]
        replicas.append(ReplicaFigures(
            url=delta.url,
            requests=delta.requests,
            hit_rate=delta.hit_rate,
            prefix_hits=delta.prefix_hits,
            prefix_queries=delta.prefix_queries,
            load_mean=sum(loads) / len(loads) if loads else None,
            load_max=max(loads) if loads else None,
        ))
    predicted = [(r.matched_tokens, r.cached_tokens) for r in good
                 if r.matched_tokens is not None and r.cached_tokens is not None]
    actual = sum(c for _, c in predicted)
    bursts = burst_shares(run)
    worst = max((max(b) / (sum(b) / len(b)) for b in bursts if sum(b) > 0), default=None)
    hits = sum(d.prefix_hits for d in run.replicas)
    queries = sum(d.prefix_queries for d in run.replicas)
    means = [r.load_mean for r in replicas if r.load_mean is not None]
    overall = sum(means) / len(means) if means else 0.0
    return RunSummary(
        label=run.label,
        workload=run.workload,
        requests=len(records),
        ok=len(good),
        errors=len(records) - len(good),
        unsent=run.drive.unsent,
        abandoned=run.drive.abandoned,
        duration_s=run.drive.duration,
        throughput_rps=len(good) / span if good else 0.0,
        output_tps=output_tokens / span if good else 0.0,
        ttft=Latency.of(ttft),
        tpot=Latency.of(tpot),
        e2e=Latency.of(e2e),
        hit_rate=hits / queries if queries else None,
        client_cached_ratio=(cached / prompt_tokens) if any_cached and prompt_tokens else None,
        max_mean_load=(max(means) / overall) if means and overall > 0 else None,
        replicas=replicas,
        requests_by_header=dict(Counter(r.replica for r in records if r.replica)),
        error_kinds=dict(Counter((r.error or "")[:80] for r in records if r.error)),
        predicted_ratio=sum(m for m, _ in predicted) / actual if actual else None,
        ejections=run.ejections,
        bursts=bursts,
        burst_max_mean=worst,
    )


def burst_shares(run: MeasuredRun) -> list[list[int]]:
    """Per burst (groups ``burst-K``), the requests each replica served from its first
    send to the next burst's, by the replicas' counters as sampled (none: not a burst run)."""
    starts: dict[int, float] = {}
    for record in run.drive.records:
        if record.group.startswith(BURST_GROUP):
            index = int(record.group[len(BURST_GROUP):])
            starts[index] = min(starts.get(index, math.inf), record.sent_at)
    samples = [s for s in run.load if s.served]
    if not starts or not samples:
        return []

    def served_at(at: float) -> tuple[float, ...]:
        before = [s for s in samples if s.at <= at]
        return (before[-1] if before else samples[0]).served

    ordered = [starts[k] for k in sorted(starts)]
    ends = [*ordered[1:], math.inf]
    shares = []
    for start, end in zip(ordered, ends):
        first, last = served_at(start), served_at(end)
        shares.append([0 if math.isnan(a) or math.isnan(b) else round(b - a)
                       for a, b in zip(first, last)])
    return shares
