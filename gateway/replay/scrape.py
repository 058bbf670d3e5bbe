"""One reading of a replica's ``/metrics``: the vLLM counters a latency fit needs.

vLLM 0.32's names (``vllm/v1/metrics/loggers.py``; the simulator exports the
same, ``engine.sim.metrics``). Histograms are read as their ``_sum`` and
``_count``, counters as their value, each summed over label sets (engines of
a data-parallel replica); the gauges, the block size, the capacity and the
served model come from the pool's own parser (``engine.pool.scrape``).

    vllm:request_prefill_time_seconds    first scheduled -> first token, per request
    vllm:request_decode_time_seconds     first token -> last token
    vllm:request_queue_time_seconds      arrival -> first scheduled
    vllm:inter_token_latency_seconds     one sample per decoded token: its step's duration
    vllm:time_to_first_token_seconds     arrival -> first token
    vllm:iteration_tokens_total          one sample per engine step: tokens it scheduled
    vllm:prefix_cache_queries_total / _hits_total   prompt tokens looked up / found
    vllm:generation_tokens_total, vllm:num_preemptions_total
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.pool.scrape import parse_vllm_metrics

HISTOGRAMS = {
    "vllm:request_prefill_time_seconds": "prefill",
    "vllm:request_decode_time_seconds": "decode",
    "vllm:request_queue_time_seconds": "queue",
    "vllm:inter_token_latency_seconds": "itl",
    "vllm:time_per_output_token_seconds": "itl_legacy",
    "vllm:time_to_first_token_seconds": "ttft",
    "vllm:iteration_tokens_total": "step_tokens",
}
COUNTERS = {
    "vllm:prefix_cache_queries_total": "queries",
    "vllm:prefix_cache_hits_total": "hits",
    "vllm:gpu_prefix_cache_queries_total": "queries",
    "vllm:gpu_prefix_cache_hits_total": "hits",
    "vllm:generation_tokens_total": "generation_tokens",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:num_preemptions_total": "preemptions",
}


@dataclass(frozen=True)
class Reading:
    """Cumulative figures of one replica at one instant (``at``: seconds, any clock)."""

    at: float
    values: dict[str, float]
    """``<histogram>_sum``, ``<histogram>_count`` and each counter, by the short names."""
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    block_size: int | None = None
    num_blocks: int | None = None
    models: tuple[str, ...] = field(default_factory=tuple)

    def get(self, name: str) -> float:
        return self.values.get(name, 0.0)


def _value(line: str) -> tuple[str, float] | None:
    brace = line.find("{")
    if brace >= 0:
        name, rest = line[:brace], line[line.rfind("}") + 1:]
    else:
        name, _, rest = line.partition(" ")
    fields = rest.split()
    if not fields:
        return None
    try:
        value = float(fields[0])
    except ValueError:
        return None
    return (name, value) if not math.isnan(value) else None


def parse_reading(text: str, at: float) -> Reading:
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        parsed = _value(line)
        if parsed is None:
            continue
        name, value = parsed
        key = COUNTERS.get(name)
        if key is None:
            base, _, suffix = name.rpartition("_")
            short = HISTOGRAMS.get(base)
            if short is None or suffix not in ("sum", "count"):
                continue
            key = f"{short}_{suffix}"
        values[key] = values.get(key, 0.0) + value
    if "itl_count" not in values and "itl_legacy_count" in values:
        values["itl_sum"] = values["itl_legacy_sum"]
        values["itl_count"] = values["itl_legacy_count"]
    gauges = parse_vllm_metrics(text)
    return Reading(at=at, values=values, running=gauges.running, waiting=gauges.waiting,
                   kv_usage=gauges.kv_usage, block_size=gauges.block_size,
                   num_blocks=gauges.num_gpu_blocks, models=gauges.model_names)
