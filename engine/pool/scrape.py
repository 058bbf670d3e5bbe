"""Read a vLLM replica's Prometheus ``/metrics`` text into typed figures.

Only the series routing and the ops view need are read, line by line (a full
exposition parser costs milliseconds on vLLM's many histograms). Values of a
series with several label sets (one per engine in data-parallel mode) are
summed; KV usage is averaged. Older vLLM names are accepted beside new ones.
The replica's own TTFT and inter-token-latency histograms are kept (bucket
counts summed over engines) so the gateway can re-export them per replica.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_GAUGES_SUM = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:prefix_cache_queries_total": "prefix_queries",
    "vllm:prefix_cache_hits_total": "prefix_hits",
    "vllm:gpu_prefix_cache_queries_total": "prefix_queries",
    "vllm:gpu_prefix_cache_hits_total": "prefix_hits",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:generation_tokens_total": "generation_tokens",
}
_GAUGES_MEAN = {
    "vllm:kv_cache_usage_perc": "kv_usage",
    "vllm:gpu_cache_usage_perc": "kv_usage",
}
_HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": "ttft",
    "vllm:inter_token_latency_seconds": "itl",
    # Older vLLM only has this name for the same inter-token histogram.
    "vllm:time_per_output_token_seconds": "itl_legacy",
}
_WANTED = sorted(
    [*_GAUGES_SUM, *_GAUGES_MEAN, "vllm:cache_config_info"]
    + [f"{base}_{suffix}" for base in _HISTOGRAMS for suffix in ("bucket", "sum", "count")],
    key=len, reverse=True)
_SERIES = re.compile(
    r"\n(" + "|".join(re.escape(name) for name in _WANTED) + r")(?:\{([^\n]*)\})?[ \t]+(\S+)")
"""One line of a series that is read: its name, its labels, its value. Only these
lines are looked at (a C-level search for the newline and name that start them):
vLLM's /metrics is ~60 KB, most of it histograms nobody here reads, and a Python
loop over every line took ~0.75 ms a scrape, every replica every second."""
_LE = re.compile(r'(?:^|,)le="([^"]*)"')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class HistogramCounts:
    """One latency histogram as last scraped: cumulative count per upper bound."""

    buckets: tuple[tuple[float, float], ...]
    """``(le, cumulative count)`` in increasing ``le``; the last bound is ``+Inf``."""
    sum: float
    count: float


@dataclass(frozen=True, slots=True)
class ReplicaMetrics:
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    prefix_queries: float = 0.0
    """Prompt tokens looked up in the prefix cache since the replica started."""
    prefix_hits: float = 0.0
    """Of those, tokens found cached."""
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    kv_cache_dtype: str | None = None
    """``cache_dtype`` of ``vllm:cache_config_info``: ``auto`` (the model's dtype), ``fp8``, ..."""
    model_names: tuple[str, ...] = ()
    ttft: HistogramCounts | None = None
    """``vllm:time_to_first_token_seconds`` of the replica."""
    itl: HistogramCounts | None = None
    """``vllm:inter_token_latency_seconds`` (older vLLM: time_per_output_token)."""


class _HistogramSum:
    def __init__(self) -> None:
        self.buckets: dict[float, float] = {}
        self.sum = 0.0
        self.count = 0.0

    def add(self, suffix: str, labels: str, value: float) -> None:
        if suffix == "bucket":
            bound = _LE.search(labels)
            if bound is None:
                return
            le = float(bound.group(1))
            self.buckets[le] = self.buckets.get(le, 0.0) + value
        elif suffix == "sum":
            self.sum += value
        else:
            self.count += value

    def freeze(self) -> HistogramCounts | None:
        if not self.buckets or math.inf not in self.buckets:
            return None
        return HistogramCounts(tuple(sorted(self.buckets.items())), self.sum, self.count)


def parse_vllm_metrics(text: str) -> ReplicaMetrics:
    sums: dict[str, float] = {}
    means: dict[str, list[float]] = {}
    block_size: int | None = None
    num_blocks: int | None = None
    kv_dtype: str | None = None
    models: set[str] = set()
    histograms: dict[str, _HistogramSum] = {}
    for match in _SERIES.finditer("\n" + text):
        name, labels, raw = match.group(1), match.group(2) or "", match.group(3)
        try:
            value = float(raw)
        except ValueError:
            continue
        if math.isnan(value):
            continue
        if name in _GAUGES_SUM:
            key = _GAUGES_SUM[name]
            sums[key] = sums.get(key, 0.0) + value
        elif name in _GAUGES_MEAN:
            means.setdefault(_GAUGES_MEAN[name], []).append(value)
        elif name == "vllm:cache_config_info":
            info = dict(_LABEL.findall(labels))
            block_size = _int_or_none(info.get("block_size"))
            num_blocks = _int_or_none(info.get("num_gpu_blocks"))
            kv_dtype = info.get("cache_dtype") or None
            continue
        else:
            base, _, suffix = name.rpartition("_")
            if base in _HISTOGRAMS and suffix in ("bucket", "sum", "count"):
                histograms.setdefault(_HISTOGRAMS[base], _HistogramSum()).add(
                    suffix, labels, value)
            continue
        for key, val in _LABEL.findall(labels):
            if key == "model_name":
                models.add(val)
    kv = means.get("kv_usage")
    return ReplicaMetrics(
        running=int(sums.get("running", 0)),
        waiting=int(sums.get("waiting", 0)),
        kv_usage=(sum(kv) / len(kv)) if kv else 0.0,
        prefix_queries=sums.get("prefix_queries", 0.0),
        prefix_hits=sums.get("prefix_hits", 0.0),
        prompt_tokens=sums.get("prompt_tokens", 0.0),
        generation_tokens=sums.get("generation_tokens", 0.0),
        block_size=block_size,
        num_gpu_blocks=num_blocks,
        kv_cache_dtype=kv_dtype,
        model_names=tuple(sorted(models)),
        ttft=_frozen(histograms.get("ttft")),
        itl=_frozen(histograms.get("itl")) or _frozen(histograms.get("itl_legacy")),
    )


def _frozen(histogram: _HistogramSum | None) -> HistogramCounts | None:
    return histogram.freeze() if histogram is not None else None


def _int_or_none(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(float(text))
    except ValueError:
        return None
