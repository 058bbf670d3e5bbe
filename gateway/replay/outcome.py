"""What one replay measured: hit rate, latencies, throughput, each replica's load.

Definitions, the same on every page that prints them:

* hit rate: prompt tokens the engine found in its prefix cache when it first
  scheduled a request (what vLLM reports as ``usage.prompt_tokens_details.
  cached_tokens``) over all prompt tokens, of the requests that got a first
  token;
* TTFT: arrival to the engine's first token (a replica's own
  ``time_to_first_token``; the gateway and the network add their own
  milliseconds); percentiles by the nearest-rank rule;
* TPOT: first to last token over the tokens after the first, per request with
  more than one;
* throughput: finished requests and output tokens per second of the span from
  the first arrival to the last finish;
* per replica: requests and prompt tokens routed there, its hit rate, the
  share of the span its engine was busy and its mean running batch while busy,
  preemptions, the longest queue it had.

A replay stopped early (``stopped``: too many requests over the TTFT limit)
describes only what it got to; its verdict ``meets`` is False for certain.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from gateway.replay.workload import Workload, nearest_rank


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    id: str
    requests: int
    prompt_tokens: int
    cached_tokens: int
    busy_s: float
    running_s: float
    """Step durations times the sequences running in them, summed."""
    preemptions: int
    peak_waiting: int

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass(frozen=True)
class ReplayOutcome:
    replicas: int
    policy: str
    requests: int
    """Requests routed (the trace less ``rejected``)."""
    completed: int
    rejected: int
    """Longer than the replicas' KV cache holds (vLLM refuses them)."""
    stopped: bool
    ttft_limit_s: float | None
    quantile: float
    hit_rate: float
    ttft_mean_s: float | None
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    ttft_p99_s: float | None
    ttft_q_s: float | None
    """TTFT at ``quantile`` (what the limit is judged on)."""
    tpot_mean_s: float | None
    tpot_p50_s: float | None
    tpot_p99_s: float | None
    span_s: float
    requests_per_s: float
    output_tokens_per_s: float
    loads: tuple[ReplicaLoad, ...]
    reasons: Mapping[str, int]

    @property
    def meets(self) -> bool | None:
        """TTFT at the quantile under the limit (None without a limit)."""
        if self.ttft_limit_s is None:
            return None
        return (not self.stopped and self.ttft_q_s is not None
                and self.ttft_q_s < self.ttft_limit_s)

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            name: getattr(self, name) for name in (
                "replicas", "policy", "requests", "completed", "rejected", "stopped",
                "ttft_limit_s", "quantile", "hit_rate", "ttft_mean_s", "ttft_p50_s",
                "ttft_p90_s", "ttft_p99_s", "ttft_q_s", "tpot_mean_s", "tpot_p50_s",
                "tpot_p99_s", "span_s", "requests_per_s", "output_tokens_per_s")}
        out["meets"] = self.meets
        out["reasons"] = dict(self.reasons)
        out["replica_loads"] = [
            {**asdict(load), "hit_rate": load.hit_rate,
             "busy_share": load.busy_s / self.span_s if self.span_s else 0.0,
             "mean_running": load.running_s / load.busy_s if load.busy_s else 0.0}
            for load in self.loads]
        return out


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _quantile(ordered: Sequence[float], q: float) -> float | None:
    return nearest_rank(ordered, q) if ordered else None


def summarise(workload: Workload, replicas: int, policy: str,
              ttft: Sequence[float | None], finish: Sequence[float | None],
              cached: Sequence[int], loads: Sequence[ReplicaLoad], reasons: Mapping[str, int],
              rejected: int, stopped: bool, ttft_limit_s: float | None,
              quantile: float) -> ReplayOutcome:
    items = workload.items
    first = [i for i, value in enumerate(ttft) if value is not None]
    ttfts = sorted(value for value in ttft if value is not None)
    prompt = sum(items[i].input_length for i in first)
    tpots: list[float] = []
    done = 0
    output_tokens = 0
    last = 0.0
    for index, end in enumerate(finish):
        if end is None:
            continue
        done += 1
        last = max(last, end)
        item = items[index]
        output_tokens += item.output_length
        start = items[index].arrival + (ttft[index] or 0.0)
        if item.output_length > 1:
            tpots.append((end - start) / (item.output_length - 1))
    tpots.sort()
    span = last - items[0].arrival if done else 0.0
    return ReplayOutcome(
        replicas=replicas, policy=policy, requests=len(items) - rejected, completed=done,
        rejected=rejected, stopped=stopped, ttft_limit_s=ttft_limit_s, quantile=quantile,
        hit_rate=sum(cached[i] for i in first) / prompt if prompt else 0.0,
        ttft_mean_s=_mean(ttfts), ttft_p50_s=_quantile(ttfts, 0.5),
        ttft_p90_s=_quantile(ttfts, 0.9), ttft_p99_s=_quantile(ttfts, 0.99),
        ttft_q_s=_quantile(ttfts, quantile),
        tpot_mean_s=_mean(tpots), tpot_p50_s=_quantile(tpots, 0.5),
        tpot_p99_s=_quantile(tpots, 0.99), span_s=span,
        requests_per_s=done / span if span else 0.0,
        output_tokens_per_s=output_tokens / span if span else 0.0,
        loads=tuple(loads), reasons=dict(reasons))
