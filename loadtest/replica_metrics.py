"""The replicas' own view of a run: their vLLM ``/metrics`` before, during, after.

The true prefix-cache hit rate is the replicas' ``vllm:prefix_cache_hits_total``
delta over their ``vllm:prefix_cache_queries_total`` delta (both in tokens)
between a scrape before and one after the run, per replica and summed. That
works the same whichever router sits in front, which is what makes contenders
comparable. Requests served per replica come from
``vllm:request_success_total`` (all finish reasons summed).

During the run :class:`LoadSampler` reads ``vllm:num_requests_running`` +
``vllm:num_requests_waiting`` of every replica every ``period`` seconds: the
load per replica over time, with each replica's request counter at that
moment (requests served between two instants, e.g. per burst).

The exposition text is read with a deliberately small parser: every sample of
a ``vllm:`` series is summed over its label sets (one engine per replica here;
several under data parallelism).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx

_SERIES = {
    "vllm:prefix_cache_hits_total": "prefix_hits",
    "vllm:prefix_cache_queries_total": "prefix_queries",
    "vllm:request_success_total": "requests",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
}


@dataclass(frozen=True, slots=True)
class ReplicaCounters:
    prefix_hits: float = 0.0
    prefix_queries: float = 0.0
    requests: float = 0.0
    prompt_tokens: float = 0.0
    running: float = 0.0
    waiting: float = 0.0


@dataclass(frozen=True, slots=True)
class ReplicaDelta:
    url: str
    prefix_hits: float
    prefix_queries: float
    requests: float
    prompt_tokens: float

    @property
    def hit_rate(self) -> float | None:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else None


def parse_counters(text: str) -> ReplicaCounters:
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        brace = line.find("{")
        if brace >= 0:
            name, rest = line[:brace], line[line.rfind("}") + 1 :]
        else:
            name, _, rest = line.partition(" ")
        key = _SERIES.get(name)
        if key is None:
            continue
        fields = rest.split()
        try:
            value = float(fields[0])
        except (IndexError, ValueError):
            continue
        if not math.isnan(value):
            sums[key] = sums.get(key, 0.0) + value
    return ReplicaCounters(**sums)


async def scrape(client: httpx.AsyncClient, url: str) -> ReplicaCounters:
    response = await client.get(url.rstrip("/") + "/metrics")
    response.raise_for_status()
    return parse_counters(response.text)


async def scrape_all(client: httpx.AsyncClient, urls: Sequence[str]) -> dict[str, ReplicaCounters]:
    results = await asyncio.gather(*(scrape(client, url) for url in urls))
    return dict(zip(urls, results))


def deltas(before: dict[str, ReplicaCounters], after: dict[str, ReplicaCounters]) -> list[ReplicaDelta]:
    out = []
    for url, end in after.items():
        begin = before.get(url, ReplicaCounters())
        out.append(ReplicaDelta(
            url=url,
            prefix_hits=end.prefix_hits - begin.prefix_hits,
            prefix_queries=end.prefix_queries - begin.prefix_queries,
            requests=end.requests - begin.requests,
            prompt_tokens=end.prompt_tokens - begin.prompt_tokens,
        ))
    return out


@dataclass(frozen=True, slots=True)
class LoadSample:
    at: float
    """Seconds since the start of the run."""
    load: tuple[float, ...]
    """running + waiting per replica, in the order of the replica URLs (NaN: scrape failed)."""
    served: tuple[float, ...] = ()
    """``vllm:request_success_total`` per replica at that moment (NaN: scrape failed)."""


class LoadSampler:
    """Samples every replica's running + waiting requests until cancelled."""

    def __init__(self, client: httpx.AsyncClient, urls: Sequence[str],
                 clock: Callable[[], float], period: float = 0.5) -> None:
        self.client = client
        self.urls = list(urls)
        self.clock = clock
        self.period = period
        self.samples: list[LoadSample] = []

    async def _one(self, url: str) -> tuple[float, float]:
        try:
            counters = await scrape(self.client, url)
        except (httpx.HTTPError, ValueError):
            return math.nan, math.nan
        return counters.running + counters.waiting, counters.requests

    async def sample(self, start: float) -> None:
        at = self.clock() - start
        found = await asyncio.gather(*(self._one(url) for url in self.urls))
        self.samples.append(LoadSample(at, tuple(load for load, _ in found),
                                       tuple(served for _, served in found)))

    async def run(self, start: float) -> None:
        while True:
            await self.sample(start)
            await asyncio.sleep(self.period)
