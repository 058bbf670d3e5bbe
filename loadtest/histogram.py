"""Quantiles of a Prometheus histogram scraped twice (the delta between scrapes).

Used for the gateway's own ``prefixgate_overhead_seconds`` (time from the
request's arrival until it leaves for the replica: parse, render, decide).
Buckets of every label set are summed; a quantile is interpolated linearly
inside the bucket that holds it, as PromQL's ``histogram_quantile`` does, so
its precision is the bucket width.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import httpx

_BUCKET = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)_bucket\{(?P<labels>[^}]*)\}\s+(?P<v>\S+)')
_LE = re.compile(r'le="([^"]+)"')


def parse_buckets(text: str, name: str) -> dict[float, float]:
    """Cumulative count per upper bound (``le``), summed over label sets."""
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        match = _BUCKET.match(line)
        if not match or match.group("name") != name:
            continue
        le = _LE.search(match.group("labels"))
        if le is None:
            continue
        bound = math.inf if le.group(1) == "+Inf" else float(le.group(1))
        buckets[bound] = buckets.get(bound, 0.0) + float(match.group("v"))
    return buckets


def delta(before: dict[float, float], after: dict[float, float]) -> dict[float, float]:
    return {bound: count - before.get(bound, 0.0) for bound, count in after.items()}


def quantile(buckets: dict[float, float], q: float) -> float | None:
    """The ``q`` quantile (0-1) of cumulative ``buckets``; ``None`` when empty."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    total = buckets[bounds[-1]]
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower_bound  # beyond the last finite bucket: its bound is all we know
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return bounds[-1]


def beyond_buckets(buckets: dict[float, float], value: float | None) -> bool:
    """Whether ``value`` is the last finite bound standing for "that or more"."""
    finite = [b for b in buckets if not math.isinf(b)]
    return value is not None and bool(finite) and value >= max(finite)


def scrape_histograms(url: str, names: Sequence[str]) -> dict[str, dict[float, float]]:
    """Several histograms from one scrape of ``url``'s ``/metrics``."""
    response = httpx.get(url.rstrip("/") + "/metrics", timeout=10.0)
    response.raise_for_status()
    return {name: parse_buckets(response.text, name) for name in names}
