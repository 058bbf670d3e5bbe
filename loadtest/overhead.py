"""``python -m loadtest overhead``: what the gateway adds, measured side by side.

Setup, all on this machine: one simulated replica with a very high
``--time-scale`` (its modeled latency shrinks to almost nothing, so what is
left is real work: HTTP, rendering, streaming) and one prefixgate gateway per
``--policy`` in front of it (one replica, so the policy's choice is trivial
and what is measured is the gateway's own path).

Workload: a closed loop of ``--concurrency`` streaming chat requests (100 by
default), prompts of about ``--prompt-len`` tokens (a system prompt shared by
a group of requests plus a distinct 128-token question: the shape of a real
app, which lets the gateway's prompt memoization work as in production) and
``--output-len`` answer tokens.

Interleaving: a warm-up round per path (discarded), then ``--rounds`` rounds
in which every path runs the same requests in turn — direct, gateway(s),
direct, ... — so slow drifts of the shared machine hit all paths alike. Each
round resets the replica's prefix cache first so every path sees the same
cache state.

Reported per path: TTFT and end-to-end p50/p99 over all measured rounds,
throughput (requests/s) at that concurrency, and for each gateway the
difference to direct (the overhead). For each gateway also its own view,
``prefixgate_overhead_seconds`` (arrival to the request leaving for the
replica) p50/p99 over the measured rounds, from its /metrics histogram.

Open loop (``--rate``): Poisson arrivals at a fixed rate instead, so the
number of streams in flight is rate x stream duration (reported as "mean in
flight") and an added delay shows up as such rather than as a lower
throughput. With ``--sim-args`` giving the replica a real latency model
(e.g. ``--time-scale 1 --sim-args "--step-overhead 0.02"``) a few dozen
requests per second keep 100 streams open without saturating the machine.
``--pin`` gives the gateways CPU 0 and the replica and the load generator
the other CPUs, as when the gateway runs on its own cores: what is measured
is then the gateway's own path, not its fight with the load generator for a
core.

``--core-quota C`` holds each serving process of every proxy path to ``C`` of
one core (:mod:`.cpu_quota`: a gateway's process, each worker of
``--workers N``, the null proxy, a peer), leaving the replica and the load
generator free: at a concurrency that saturates them, each path's throughput
is what its share of the CPU serves, and N workers against one is the gain
of N cores, measurable on a box too small to give each its own. The report
adds each path's limited processes, their CPU and the periods they were
throttled in (a path never throttled was not the bottleneck).

``--null-proxy`` adds a path through a pass-through proxy on the gateway's
server stack (``loadtest/null_proxy.py``, pinned like the gateways): what the
extra hop alone costs on this machine, so that a gateway's figures minus the
null proxy's are its own work.

``--peers sglang-router:cache_aware,vllm-router:cache_aware`` adds the peer
routers (installed into venvs of their own on first use, :mod:`.peers`) as
more paths in front of the same replica, run in every round like the
gateways, pinned like them under ``--pin`` (started already on the
proxies' CPU, so a runtime that sizes its thread pool to the usable cores
sees one). A peer that cannot be installed or started is reported
"unavailable" and the run goes on without it. Both peers forward the
client's ``X-Request-Id``, so their TTFT outside the replica is joined to
the replica's timing log like the gateways'. ``--rotate`` shifts the order
of the paths by one each round (the order within a round moved client-side
figures by a few ms in earlier runs; rotated, no path always runs last).

CPU per request: the user + system CPU seconds, over its measured rounds,
of the process tree the benchmark started for the path (the root and every
descendant, all threads: :mod:`.proc_tree`), divided by the requests. For
the peers that tree is one process: the Python launcher loads the Rust
router as an extension and runs it in-process (vllm-router 0.1.17 and
sglang-router 0.3.2 rename themselves ``vllm::router``, ``sglang::router``;
no child processes). Reported for each proxy as a multiple of the null
proxy's (``cpu_over_null``) and of each peer's (``cpu_over_peers``; the
"Side by side" table and the lines under it).

At a concurrency that saturates the machine, closed-loop latency is
``concurrency / throughput``: the end-to-end difference then measures the
gateway's CPU cost per request (it takes cores from the replica and the load
generator), not a delay on the request's path. Run it at a low concurrency as
well to see the latency a request pays when the cores are not the bottleneck. Caveat printed with the numbers: the
load generator, the replica and the gateway share the machine's cores, so a
gateway's CPU time also slows the other two; on 2 cores that is part of what
is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager, nullcontext, suppress
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from loadtest import markdown, sections
from loadtest.contenders import ContenderSpec, ContenderUnavailable, launch
from loadtest.cpu_quota import (
    PERIOD_US,
    CoreQuota,
    find_hierarchy,
    is_helper,
    serving_processes,
)
from loadtest.driver import DriveResult
from loadtest.histogram import beyond_buckets, delta, quantile, scrape_histograms
from loadtest.loop import loop_name, run
from loadtest.machine import machine_info
from loadtest.measure import MeasuredRun, RunLimits, RunTarget, measure
from loadtest.plots import ttft_cdf
from loadtest.proc_tree import (
    ProcStat,
    all_stats,
    descendants,
    tree_cpu_seconds,
    tree_shape,
    tree_threads,
)
from loadtest.processes import Service, ServiceGroup, free_port
from loadtest.results import ContenderResult
from loadtest.sims import SimFleetSpec, reset_caches, start_sims
from loadtest.summary import percentile
from loadtest.workloads.base import Workload
from loadtest.workloads.mooncake import repo_root
from loadtest.workloads.shared_prefix import SharedPrefixParams
from loadtest.workloads.shared_prefix import build as build_shared_prefix

QUESTION_LEN = 128
OVERHEAD_SERIES = "prefixgate_overhead_seconds"
ADDED_TTFT_SERIES = "prefixgate_added_ttft_seconds"
LOOP_LAG_SERIES = "prefixgate_event_loop_lag_seconds"
GC_SERIES = "prefixgate_gc_pause_seconds"
GATEWAY_SERIES = (OVERHEAD_SERIES, ADDED_TTFT_SERIES, LOOP_LAG_SERIES, GC_SERIES)
"""The gateway's own histograms, read back around each measured run."""
NULL_PROXY = "null-proxy"
PEER_KINDS = ("vllm-router", "sglang-router")


@dataclass(frozen=True)
class PathFigures:
    name: str
    requests: int
    errors: int
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    e2e_p50_ms: float | None
    e2e_p99_ms: float | None
    throughput_rps: float
    mean_in_flight: float = 0.0
    """Requests in flight on average (sum of e2e times over the run's span)."""
    ttft_overhead_p50_ms: float | None = None
    ttft_overhead_p99_ms: float | None = None
    e2e_overhead_p50_ms: float | None = None
    e2e_overhead_p99_ms: float | None = None
    throughput_ratio: float | None = None
    gateway_overhead_p50_ms: float | None = None
    gateway_overhead_p99_ms: float | None = None
    gateway_overhead_p99_beyond_buckets: bool = False
    """True when the p99 lies past the histogram's last bucket (it is at least that)."""
    added_ttft_p50_ms: float | None = None
    added_ttft_p99_ms: float | None = None
    """The gateway's own ``prefixgate_added_ttft_seconds``: its time on a stream's
    way to the first token (before forwarding + relaying the first chunk)."""
    added_ttft_p99_beyond_buckets: bool = False
    loop_lag_p50_ms: float | None = None
    loop_lag_p99_ms: float | None = None
    """``prefixgate_event_loop_lag_seconds`` over the measured rounds."""
    gc_pauses: int | None = None
    gc_pauses_over_1ms: int | None = None
    gc_longest_ms: float | None = None
    """Upper bound of the bucket holding the longest collection (``prefixgate_gc_pause_seconds``)."""
    outside_p50_ms: float | None = None
    outside_p99_ms: float | None = None
    """TTFT outside the replica: the client's TTFT minus the replica's own time
    from receiving the request to its first token (its ``/sim/timings``), per
    request; what the path between client and replica costs, without the
    replica's queueing and engine-step phase."""
    inbound_p50_ms: float | None = None
    """Client send to the replica's handler receiving the request."""
    outside_overhead_p50_ms: float | None = None
    outside_overhead_p99_ms: float | None = None
    over_null_p50_ms: float | None = None
    over_null_p99_ms: float | None = None
    """Outside-the-replica figures minus the null proxy's: the gateway's own work."""
    timed: int = 0
    """Requests joined to the replica's timing log."""
    cpu_ms_per_request: float | None = None
    """The proxy process's CPU time (user + system, all threads) over its
    measured rounds, per request: its whole cost, whatever the latency."""
    cpu_over_null: float | None = None
    """``cpu_ms_per_request`` as a multiple of the null proxy's."""
    cpu_over_peers: dict[str, float] | None = None
    """``cpu_ms_per_request`` as a multiple of each peer router's (``--peers``), by name."""


def overhead_workload(args: argparse.Namespace, seed: int) -> Workload:
    groups = max(1, args.distinct_prompts // 8)
    per_group = -(-args.requests // groups)
    params = SharedPrefixParams(
        groups=groups, prompts_per_group=per_group,
        system_len=max(1, args.prompt_len - QUESTION_LEN), question_len=QUESTION_LEN,
        output_len=args.output_len, seed=seed,
        rate=args.rate, concurrency=args.concurrency if args.concurrency else None)
    workload = build_shared_prefix(params)
    conversations = workload.conversations[: args.requests]
    return Workload("overhead", conversations, workload.pacing, workload.ignore_eos,
                    {**workload.params, "requests": len(conversations)})


def _merge(name: str, runs: Sequence[MeasuredRun]) -> MeasuredRun:
    records = tuple(r for run_ in runs for r in run_.drive.records)
    duration = sum(run_.drive.duration for run_ in runs)
    drive = DriveResult(records, (), duration, sum(r.drive.unsent for r in runs),
                        sum(r.drive.abandoned for r in runs))
    return MeasuredRun(name, "overhead", (), drive, (), ())


def _figures(name: str, runs: Sequence[MeasuredRun]) -> PathFigures:
    good = [r for run_ in runs for r in run_.drive.records if r.ok]
    total = sum(len(run_.drive.records) for run_ in runs)
    ttft = [r.ttft * 1000 for r in good if r.ttft is not None]
    e2e = [r.e2e * 1000 for r in good if r.e2e is not None]
    # Throughput per round (first send to last answer), averaged over rounds.
    rates, in_flight = [], []
    for run_ in runs:
        ok = [r for r in run_.drive.records if r.ok]
        if ok:
            span = max(r.sent_at + (r.e2e or 0) for r in ok) - min(r.sent_at for r in ok)
            rates.append(len(ok) / span if span > 0 else 0.0)
            in_flight.append(sum(r.e2e or 0 for r in ok) / span if span > 0 else 0.0)
    return PathFigures(name, total, total - len(good), percentile(ttft, 50), percentile(ttft, 99),
                       percentile(e2e, 50), percentile(e2e, 99),
                       sum(rates) / len(rates) if rates else 0.0,
                       sum(in_flight) / len(in_flight) if in_flight else 0.0)


def replica_timings(url: str) -> dict[str, tuple[float, float | None]]:
    """The simulated replica's timing log: request id -> (received, first token)."""
    response = httpx.get(url.rstrip("/") + "/sim/timings", timeout=30.0)
    response.raise_for_status()
    return {t["id"]: (t["received"], t["first_token"]) for t in response.json()["requests"]}


def outside_replica(run_: MeasuredRun, timings: dict[str, tuple[float, float | None]],
                    ) -> list[tuple[float, float]]:
    """(TTFT outside the replica, client send to replica receipt) per joined request."""
    out = []
    for r in run_.drive.records:
        received, first = timings.get(r.request_id or "", (0.0, None))
        if not r.ok or r.ttft is None or r.started is None or first is None:
            continue
        out.append((r.ttft - (first - received), received - r.started))
    return out


def _with_outside(path: PathFigures, hops: Sequence[tuple[float, float]]) -> PathFigures:
    outside = [h[0] * 1000 for h in hops]
    inbound = [h[1] * 1000 for h in hops]
    return PathFigures(**{**path.__dict__, "outside_p50_ms": percentile(outside, 50),
                          "outside_p99_ms": percentile(outside, 99),
                          "inbound_p50_ms": percentile(inbound, 50), "timed": len(hops)})


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _over_null(path: PathFigures, null: PathFigures) -> PathFigures:
    return PathFigures(**{**path.__dict__,
                          "over_null_p50_ms": _diff(path.outside_p50_ms, null.outside_p50_ms),
                          "over_null_p99_ms": _diff(path.outside_p99_ms, null.outside_p99_ms)})


def _with_cpu(path: PathFigures, seconds: float | None, null: PathFigures | None) -> PathFigures:
    if seconds is None or not path.requests:
        return path
    per_request = seconds * 1000 / path.requests
    base = null.cpu_ms_per_request if null is not None else None
    return PathFigures(**{**path.__dict__, "cpu_ms_per_request": per_request,
                          "cpu_over_null": per_request / base if base else None})


def with_peer_ratios(rows: Sequence[PathFigures], peers: Sequence[str]) -> list[PathFigures]:
    """Each row's CPU per request as a multiple of each peer's (a peer's own ratio is 1)."""
    bases = {p.name: p.cpu_ms_per_request for p in rows if p.name in peers}
    out = []
    for row in rows:
        if row.cpu_ms_per_request is None:
            out.append(row)
            continue
        ratios = {name: row.cpu_ms_per_request / base for name, base in bases.items() if base}
        out.append(PathFigures(**{**row.__dict__, "cpu_over_peers": ratios or None}))
    return out


def parse_peers(text: str) -> list[ContenderSpec]:
    """``--peers``: comma-separated peer routers, e.g. ``sglang-router:cache_aware``."""
    specs = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        try:
            spec = ContenderSpec.parse(item)
        except ValueError as exc:
            raise SystemExit(f"--peers: {exc}") from None
        if spec.kind not in PEER_KINDS:
            raise SystemExit(f"--peers: {item!r} is not a peer router "
                             f"({' or '.join(k + ':POLICY' for k in PEER_KINDS)})")
        if spec in specs:
            raise SystemExit(f"--peers: {item!r} given twice")
        specs.append(spec)
    return specs


def round_order(names: Sequence[str], round_index: int, rotate: bool) -> list[str]:
    """The paths in the order a round runs them: as given, or shifted by one per round
    (``--rotate``), so that no path always runs first or last."""
    if not rotate or not names:
        return list(names)
    shift = round_index % len(names)
    return list(names[shift:]) + list(names[:shift])


def start_null_proxy(upstream: str, group: ServiceGroup, log_dir: Path) -> str:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    group.start(Service(NULL_PROXY, [sys.executable, "-m", "loadtest.null_proxy", "--port",
                                     str(port), "--upstream", upstream], url + "/health",
                        log_dir / "null-proxy.log"), timeout=60.0)
    return url


def _ms_or_none(value: float | None) -> float | None:
    return None if value is None else value * 1000


def gc_figures(buckets: dict[float, float]) -> dict[str, Any]:
    """Collections, those over 1 ms, and the bucket bound of the longest."""
    if not buckets:
        return {}
    total = buckets.get(float("inf"), 0.0)
    longest = min((b for b, c in buckets.items() if c >= total), default=None)
    return {"gc_pauses": int(total), "gc_pauses_over_1ms": int(total - buckets.get(0.001, 0.0)),
            "gc_longest_ms": _ms_or_none(longest)}


def _with_overhead(path: PathFigures, direct: PathFigures,
                   histograms: dict[str, dict[float, float]]) -> PathFigures:
    """``histograms``: the gateway's own series (``GATEWAY_SERIES``) over the measured rounds."""
    own = histograms.get(OVERHEAD_SERIES, {})
    added = histograms.get(ADDED_TTFT_SERIES, {})
    lag = histograms.get(LOOP_LAG_SERIES, {})
    return PathFigures(
        **{**path.__dict__,
           "ttft_overhead_p50_ms": _diff(path.ttft_p50_ms, direct.ttft_p50_ms),
           "ttft_overhead_p99_ms": _diff(path.ttft_p99_ms, direct.ttft_p99_ms),
           "outside_overhead_p50_ms": _diff(path.outside_p50_ms, direct.outside_p50_ms),
           "outside_overhead_p99_ms": _diff(path.outside_p99_ms, direct.outside_p99_ms),
           "e2e_overhead_p50_ms": _diff(path.e2e_p50_ms, direct.e2e_p50_ms),
           "e2e_overhead_p99_ms": _diff(path.e2e_p99_ms, direct.e2e_p99_ms),
           "throughput_ratio": path.throughput_rps / direct.throughput_rps
           if direct.throughput_rps else None,
           "gateway_overhead_p50_ms": _ms_or_none(quantile(own, 0.5)),
           "gateway_overhead_p99_ms": _ms_or_none(quantile(own, 0.99)),
           "gateway_overhead_p99_beyond_buckets": beyond_buckets(own, quantile(own, 0.99)),
           "added_ttft_p50_ms": _ms_or_none(quantile(added, 0.5)),
           "added_ttft_p99_ms": _ms_or_none(quantile(added, 0.99)),
           "added_ttft_p99_beyond_buckets": beyond_buckets(added, quantile(added, 0.99)),
           "loop_lag_p50_ms": _ms_or_none(quantile(lag, 0.5)),
           "loop_lag_p99_ms": _ms_or_none(quantile(lag, 0.99)),
           **gc_figures(histograms.get(GC_SERIES, {}))})


def _cpu_cell(p: PathFigures) -> str:
    if p.cpu_ms_per_request is None:
        return markdown.MISSING
    ratio = f" ({p.cpu_over_null:.2f}x)" if p.cpu_over_null is not None else ""
    return f"{p.cpu_ms_per_request:.2f}{ratio}"


def _pair(p50: float | None, p99: float | None, digits: int = 1,
          p99_beyond_buckets: bool = False) -> str:
    at_least = ">= " if p99_beyond_buckets else ""
    return f"{markdown.num(p50, digits)} / {at_least}{markdown.num(p99, digits)}"


HEADER = ("path", "requests", "errors", "TTFT p50 ms", "TTFT p99 ms", "e2e p50 ms", "e2e p99 ms",
          "req/s", "mean in flight", "TTFT overhead p50 / p99 ms", "e2e overhead p50 / p99 ms",
          "throughput vs direct", "in-gateway overhead p50 / p99 ms",
          "in-gateway added TTFT p50 / p99 ms", "TTFT outside the replica p50 / p99 ms",
          "its overhead p50 / p99 ms", "send to replica p50 ms",
          "CPU ms per request (x null proxy)")


def _row(p: PathFigures) -> list[str]:
    num = markdown.num
    own = (_pair(p.gateway_overhead_p50_ms, p.gateway_overhead_p99_ms, 3,
                 p.gateway_overhead_p99_beyond_buckets)
           if p.gateway_overhead_p50_ms is not None else markdown.MISSING)
    added = (_pair(p.added_ttft_p50_ms, p.added_ttft_p99_ms, 3, p.added_ttft_p99_beyond_buckets)
             if p.added_ttft_p50_ms is not None else markdown.MISSING)
    return [p.name, str(p.requests), str(p.errors), num(p.ttft_p50_ms), num(p.ttft_p99_ms),
            num(p.e2e_p50_ms), num(p.e2e_p99_ms), num(p.throughput_rps),
            num(p.mean_in_flight, 0), _pair(p.ttft_overhead_p50_ms, p.ttft_overhead_p99_ms),
            _pair(p.e2e_overhead_p50_ms, p.e2e_overhead_p99_ms), num(p.throughput_ratio, 2),
            own, added, _pair(p.outside_p50_ms, p.outside_p99_ms, 2),
            _pair(p.outside_overhead_p50_ms, p.outside_overhead_p99_ms, 2),
            num(p.inbound_p50_ms, 2), _cpu_cell(p)]


def markdown_table(paths: Sequence[PathFigures], target_p50: float, target_p99: float) -> str:
    """The table of every path, then a verdict per gateway figure against the target."""
    verdicts = []
    target = f"(p50 < {target_p50:g} ms, p99 < {target_p99:g} ms)"
    for p in paths:
        if p.ttft_overhead_p50_ms is None or p.ttft_overhead_p99_ms is None:
            continue
        met = p.ttft_overhead_p50_ms < target_p50 and p.ttft_overhead_p99_ms < target_p99
        verdicts.append(f"- {p.name}: client-side TTFT overhead p50 {p.ttft_overhead_p50_ms:.1f} ms, "
                        f"p99 {p.ttft_overhead_p99_ms:.1f} ms -> target {target} "
                        f"{'MET' if met else 'NOT MET'}")
        if p.outside_overhead_p50_ms is not None and p.outside_overhead_p99_ms is not None:
            met = p.outside_overhead_p50_ms < target_p50 and p.outside_overhead_p99_ms < target_p99
            verdicts.append(
                f"- {p.name}: TTFT outside the replica, overhead p50 "
                f"{p.outside_overhead_p50_ms:.2f} ms, p99 {p.outside_overhead_p99_ms:.2f} ms "
                f"({p.timed} requests joined to the replica's timing log) -> target {target} "
                f"{'MET' if met else 'NOT MET'}")
        if p.over_null_p50_ms is not None and p.over_null_p99_ms is not None:
            verdicts.append(
                f"- {p.name}: TTFT outside the replica over the null proxy's (its own work "
                f"beyond the hop) p50 {p.over_null_p50_ms:.2f} ms, p99 {p.over_null_p99_ms:.2f} ms")
        if p.added_ttft_p50_ms is not None and p.added_ttft_p99_ms is not None:
            met = (p.added_ttft_p50_ms < target_p50 and p.added_ttft_p99_ms < target_p99
                   and not p.added_ttft_p99_beyond_buckets)
            at_least = ">= " if p.added_ttft_p99_beyond_buckets else ""
            verdicts.append(
                f"- {p.name}: in-gateway added TTFT p50 {p.added_ttft_p50_ms:.3f} ms, "
                f"p99 {at_least}{p.added_ttft_p99_ms:.3f} ms -> target {target} "
                f"{'MET' if met else 'NOT MET'}")
        if p.loop_lag_p50_ms is not None and p.loop_lag_p99_ms is not None:
            verdicts.append(f"- {p.name}: event-loop lag p50 {p.loop_lag_p50_ms:.3f} ms, "
                            f"p99 {p.loop_lag_p99_ms:.3f} ms")
        if p.gc_pauses is not None:
            verdicts.append(f"- {p.name}: {p.gc_pauses} garbage collections, "
                            f"{p.gc_pauses_over_1ms} over 1 ms, the longest <= "
                            f"{markdown.num(p.gc_longest_ms, 2)} ms")
    return markdown.table(HEADER, (_row(p) for p in paths)) + "\n" + "\n".join(verdicts) + "\n"


def side_by_side(paths: Sequence[PathFigures], peers: Sequence[str]) -> str:
    """Every path on the figures a comparison with the peers needs, then CPU per request
    of each proxy as a multiple of the null proxy's and of each peer's."""
    header = ["path", "TTFT outside the replica p50 / p99 ms", "over the null proxy p50 / p99 ms",
              "e2e p50 / p99 ms", "req/s", "CPU ms per request", "x null proxy",
              *(f"x {peer}" for peer in peers)]
    rows = []
    for p in paths:
        over = (p.over_null_p50_ms, p.over_null_p99_ms)
        ratios = p.cpu_over_peers or {}
        rows.append([p.name, _pair(p.outside_p50_ms, p.outside_p99_ms, 2),
                     _pair(*over, 2) if over[0] is not None else markdown.MISSING,
                     _pair(p.e2e_p50_ms, p.e2e_p99_ms), markdown.num(p.throughput_rps, 2),
                     markdown.num(p.cpu_ms_per_request, 2), markdown.num(p.cpu_over_null, 2),
                     *(markdown.num(ratios.get(peer), 2) for peer in peers)])
    lines = []
    for p in paths:
        if p.cpu_ms_per_request is None or p.name in (NULL_PROXY, *peers):
            continue
        parts = [f"{p.cpu_over_null:.2f}x null proxy"] if p.cpu_over_null is not None else []
        parts += [f"{ratio:.2f}x {peer}" for peer, ratio in (p.cpu_over_peers or {}).items()]
        if parts:
            lines.append(f"- {p.name} CPU/request = {', '.join(parts)}")
    return markdown.table(header, rows) + ("\n" + "\n".join(lines) + "\n" if lines else "")


def overhead_command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    out: Path = args.out
    log_dir = out / "logs"
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    gateways = [ContenderSpec("prefixgate", p) for p in policies]
    peers = parse_peers(args.peers)
    fleet = SimFleetSpec(count=1, num_blocks=args.num_blocks, time_scale=args.time_scale,
                         extra_args=tuple(shlex.split(args.sim_args)),
                         kv_events=any(s.needs_kv_events() for s in (*gateways, *peers)))
    limits = RunLimits(max_duration=args.max_duration, request_timeout=args.request_timeout,
                       raw_client=args.client == "raw")
    histograms: dict[str, dict[str, dict[float, float]]] = {}
    """Per gateway path, per series: bucket counts summed over the measured rounds."""
    cpu: dict[str, float] = {}
    """Per proxy path (null proxy, gateways, peers): its process tree's CPU seconds over the
    measured rounds."""
    unavailable: dict[str, str] = {}
    """Peers that could not be installed or started, and why."""
    shapes: dict[str, dict[str, int]] = {}
    """Per proxy path: the processes and threads of its tree after the last round."""
    tallies: dict[str, sections.Tally] = {}
    """Per gateway path with ``--cpu-sections``: its CPU by section over the measured
    rounds."""
    sections_dir = out / "cpu-sections"
    cpus = sorted(os.sched_getaffinity(0))
    if args.pin and len(cpus) < 2:
        raise SystemExit("--pin needs at least 2 CPUs")
    with ExitStack() as stack:
        group = stack.enter_context(ServiceGroup())
        replicas = start_sims(fleet, group, log_dir)
        urls = {"direct": replicas[0].url}
        # Under --pin every proxy starts on the proxies' CPU, so a router that sizes its
        # thread pool to the cores it may use (a Tokio runtime) sees that one.
        with _affinity({cpus[0]} if args.pin else set(cpus)):
            if args.null_proxy:
                urls[NULL_PROXY] = start_null_proxy(replicas[0].url, group, log_dir)
            with sections.harness(sections_dir) if args.cpu_sections else nullcontext():
                for spec in gateways:
                    urls[spec.name] = launch(spec, replicas, fleet.model,
                                             fleet.tokenizer_path(), group, log_dir)
            for spec in peers:
                try:
                    urls[spec.name] = launch(spec, replicas, fleet.model, fleet.tokenizer_path(),
                                             group, log_dir)
                except ContenderUnavailable as exc:
                    unavailable[spec.name] = str(exc)
                    print(f"{spec.name} unavailable: {exc}", file=sys.stderr, flush=True)
        # A gateway's service is named after its contender, ":" spelled "-".
        pids = {name: s.process.pid for name in urls for s in group.services
                if s.name in (name, name.replace(":", "-")) and s.process is not None}
        if args.pin:
            pin(group, proxies=[pids[name] for name in urls if name in pids])
        quota = stack.enter_context(limit_cores(args.core_quota, pids)) \
            if args.core_quota else None
        runs: dict[str, list[MeasuredRun]] = {name: [] for name in urls}
        hops: dict[str, list[tuple[float, float]]] = {name: [] for name in urls}
        for round_index in range(args.rounds + 1):
            workload = overhead_workload(args, seed=round_index)
            for name in round_order(list(urls), round_index, args.rotate):
                url = urls[name]
                reset_caches(replicas)
                gateway = name.startswith("prefixgate")
                before = scrape_histograms(url, GATEWAY_SERIES) if gateway else {}
                cpu_before = tree_cpu_seconds(pids[name]) if name in pids else 0.0
                traced = args.cpu_sections and gateway and name in pids
                sections_before = sections.read_tree(sections_dir, pids[name]) if traced else {}
                print(f"== round {round_index}{' (warm-up)' if round_index == 0 else ''}: {name}",
                      file=sys.stderr, flush=True)
                measured = run(partial(measure, workload, RunTarget(name, url, fleet.model), [],
                                       limits))
                if round_index > 0:
                    runs[name].append(measured)
                    if name in pids:
                        cpu[name] = (cpu.get(name, 0.0) + tree_cpu_seconds(pids[name])
                                     - cpu_before)
                    if traced:
                        tallies.setdefault(name, sections.Tally()).add(
                            sections_before, sections.read_tree(sections_dir, pids[name]),
                            args.requests)
                    hops[name].extend(outside_replica(measured, replica_timings(replicas[0].url)))
                    if gateway:
                        after = scrape_histograms(url, GATEWAY_SERIES)
                        for series in GATEWAY_SERIES:
                            total = histograms.setdefault(name, {}).setdefault(series, {})
                            for bound, count in delta(before[series], after[series]).items():
                                total[bound] = total.get(bound, 0.0) + count
        shapes = {name: tree_shape(pid) for name, pid in pids.items()}
        limited = quota_report(quota, pids) if quota is not None else {}
    figures = {name: _with_outside(_figures(name, rs), hops[name]) for name, rs in runs.items()}
    direct = figures["direct"]
    rows = [direct] + [_with_overhead(f, direct, histograms.get(n, {}))
                       for n, f in figures.items() if n != "direct"]
    null = figures.get(NULL_PROXY)
    if null is not None:
        null = _with_cpu(null, cpu.get(NULL_PROXY), None)
        rows = [_over_null(row, null) if row.name not in ("direct", NULL_PROXY) else row
                for row in rows]
    rows = [_with_cpu(row, cpu.get(row.name), null) for row in rows]
    measured_peers = [spec.name for spec in peers if spec.name in urls]
    rows = with_peer_ratios(rows, measured_peers)
    out.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {
        "command": "python -m loadtest " + " ".join(shlex.quote(a) for a in argv),
        "machine": machine_info(repo_root()), "event_loop": loop_name(),
        "concurrency": args.concurrency, "requests_per_round": args.requests,
        "rounds": args.rounds, "prompt_len": args.prompt_len, "output_len": args.output_len,
        "sim": {"time_scale": args.time_scale, "num_blocks": args.num_blocks,
                "extra_args": args.sim_args, "kv_events": fleet.kv_events},
        "rate": args.rate, "pinned": args.pin, "client": args.client, "rotate": args.rotate,
        "peers": [spec.name for spec in peers], "unavailable": unavailable,
        "process_trees": shapes,
        "cpu_sections": sections.as_json(tallies) if args.cpu_sections else None,
        "core_quota": ({"cores": args.core_quota, "period_us": PERIOD_US, "paths": limited}
                       if args.core_quota else None),
    }
    (out / "overhead.json").write_text(json.dumps(
        {"meta": meta, "paths": [r.__dict__ for r in rows]}, indent=2) + "\n")
    table = markdown_table(rows, 2.0, 5.0)
    if peers:
        notes = "".join(f"- {name}: unavailable: {reason.splitlines()[0] if reason else ''}\n"
                        for name, reason in unavailable.items())
        table += "\n## Side by side\n\n" + side_by_side(rows, measured_peers) + (
            "\n" + notes if notes else "")
    if quota is not None:
        table += "\n## Each serving process on a share of a core\n\n" + quota_table(
            rows, limited, args.core_quota)
    if tallies:
        table += ("\n## Where each gateway's CPU goes (--cpu-sections)\n\n"
                  + sections.table(tallies))
    markdown.write(out / "overhead.md", table, "Gateway overhead")
    merged = [ContenderResult(name, run=_merge(name, rs)) for name, rs in runs.items() if rs]
    load = (f"open loop at {args.rate:g} requests/s" if args.rate
            else f"{args.concurrency} concurrent streams")
    ttft_cdf(merged, out / "overhead_ttft_cdf.png", f"TTFT, {load}, each path")
    print(table)
    return 0


@contextmanager
def _affinity(cpus: set[int]) -> Iterator[None]:
    """This thread (and the processes it starts meanwhile) on ``cpus``; restored after."""
    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, saved)


def pin(group: ServiceGroup, proxies: Sequence[int]) -> None:
    """CPU 0 for the proxies' process trees (gateways, null proxy, peers), the other CPUs
    for everything else (this process too)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--pin needs at least 2 CPUs")
    own, rest = {cpus[0]}, set(cpus[1:])
    for service in group.services:
        if service.process is not None:
            _pin_tree(service.process.pid, own if service.process.pid in proxies else rest)
    for tid in os.listdir(f"/proc/{os.getpid()}/task"):  # this process, not its children
        os.sched_setaffinity(int(tid), rest)
    print(f"pinned: gateways and peers on CPU {cpus[0]}, replica and load generator on "
          f"{sorted(rest)}", file=sys.stderr)


@contextmanager
def limit_cores(cores: float, pids: dict[str, int]) -> Iterator[CoreQuota]:
    """Each serving process of every proxy path (:func:`.serving_processes`) limited to
    ``cores`` of a core (:mod:`.cpu_quota`), once every tree has stopped growing (a
    supervisor starts its workers after it answers)."""
    quota = CoreQuota(find_hierarchy(), cores)
    try:
        stats = _settled_stats(list(pids.values()))
        for name, root in pids.items():
            tree = descendants(root, stats)
            helpers = frozenset(p for p in tree if is_helper(p))
            serving = serving_processes(root, {p: stats[p].ppid for p in tree}, helpers)
            for pid, members in serving.items():
                quota.limit(pid, tuple(members))
            print(f"{name}: {len(serving)} serving process(es) limited to {cores:g} of a "
                  "core each", file=sys.stderr)
        yield quota
    finally:
        quota.close()


def _settled_stats(roots: list[int], tries: int = 20) -> dict[int, ProcStat]:
    """``/proc``'s processes once the trees under ``roots`` kept their size for a second."""
    sizes: list[int] = []
    stats = all_stats()
    for _ in range(tries):
        stats = all_stats()
        sizes.append(sum(len(descendants(root, stats)) for root in roots))
        if len(sizes) >= 3 and sizes[-1] == sizes[-2] == sizes[-3]:
            break
        time.sleep(0.5)
    return stats


def quota_report(quota: CoreQuota, pids: dict[str, int]) -> dict[str, dict[str, Any]]:
    """Per path: how many of its processes were limited, and the periods they were
    stopped in for it (a path never stopped was not the bottleneck)."""
    throttled = quota.throttled()
    stats = all_stats()
    report = {}
    for name, root in pids.items():
        tree = set(descendants(root, stats))
        mine = [pid for pid in quota.groups if pid in tree]
        report[name] = {"limited": len(mine),
                        "throttled_periods": sum(throttled.get(pid, 0) for pid in mine),
                        "cpu_seconds": [round(tree_cpu_seconds(pid), 2) for pid in mine]}
    return report


def quota_table(rows: Sequence[PathFigures], limited: dict[str, dict[str, Any]],
                cores: float) -> str:
    """Throughput of each limited path against the first gateway's: at saturation, what
    N serving processes on N shares of a core do against one."""
    base = next((r for r in rows if r.name.startswith("prefixgate")), None)
    lines = [(f"Each serving process limited to {cores:g} of a core ({PERIOD_US // 1000} ms "
             "periods); the replica and the load generator not limited."), "",
             "| path | processes limited | their CPU seconds | periods throttled | requests/s | x "
             + (base.name if base else "-") + " |", "|---|---|---|---|---|---|"]
    for row in rows:
        if row.name not in limited:
            continue
        ratio = (f"{row.throughput_rps / base.throughput_rps:.2f}"
                 if base and base.throughput_rps else "-")
        seconds = " / ".join(f"{c:g}" for c in limited[row.name]["cpu_seconds"])
        lines.append(f"| {row.name} | {limited[row.name]['limited']} | {seconds} | "
                     f"{limited[row.name]['throttled_periods']} | {row.throughput_rps:.1f} | "
                     f"{ratio} |")
    return "\n".join(lines) + "\n"


def _pin_tree(pid: int, cpus: set[int]) -> None:
    """Every thread of every process in the tree (affinity is per thread on Linux)."""
    for tid in tree_threads(pid):
        with suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, cpus)
