"""The memos' sizes and the routing bounds' counts, read at scrape time.

    prefixgate_memo_entries{model,memo}          entries held
    prefixgate_memo_bytes{model,memo}            estimated bytes held
    prefixgate_memo_bytes_limit{model,memo}      the configured byte bound
    prefixgate_routing_fallbacks_total{model,reason}
        requests routing did not analyse as sent: ``client_template`` (rendered
        with the model's template instead), ``media``, ``truncated``
        (``truncate_prompt_tokens`` cuts the prompt's start), ``oversize``,
        ``token_ids``, ``render``, ``error`` (routed by load); see
        ``gateway.prompt.bounds``
    prefixgate_routing_truncated_total{model}    requests analysed only in part

``memo``: ``pieces`` (token ids per prompt piece), ``chain`` (block hashes per
piece), ``turns`` (conversation turns), ``anchors`` and ``generation_prompts``
(the conversation memo's rendered texts), ``reuse_marks`` (piece reuse),
``compiled_templates`` (the linter's clock probe; ``model="*"``). The byte
renderer's hasher, shared by every model without a tokenizer, is
``model="*"`` too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.prompt.hashers import HasherSet
from policies.lru import LRU

Memos = Callable[[], "dict[str, LRU[Any, Any]]"]


class MemoCollector(Collector):
    def __init__(self, hashers: HasherSet, shared: Memos | None = None) -> None:
        self._hashers = hashers
        self._shared = shared if shared is not None else dict

    def describe(self) -> Iterator[Metric]:
        """The families without samples (the registry reads names before start-up ends)."""
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        entries, size, limit, fallbacks, truncated = self._families()
        memos = [(model, name, lru) for model, hasher in self._hashers.every()
                 for name, lru in hasher.memos().items()]
        memos += [("*", name, lru) for name, lru in self._shared().items()]
        for model, name, lru in memos:
            entries.add_metric([model, name], len(lru))
            size.add_metric([model, name], lru.bytes)
            if lru.max_bytes is not None:
                limit.add_metric([model, name], lru.max_bytes)
        for model, hasher in self._hashers.every():
            for reason, count in sorted(hasher.fallbacks.items()):
                fallbacks.add_metric([model, reason], count)
            truncated.add_metric([model], hasher.truncated)
        yield from (entries, size, limit, fallbacks, truncated)

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily,
                             CounterMetricFamily, CounterMetricFamily]:
        labels = ["model", "memo"]
        entries = GaugeMetricFamily("prefixgate_memo_entries", "Entries a memo holds", labels=labels)
        size = GaugeMetricFamily("prefixgate_memo_bytes", "Estimated bytes a memo holds",
                                 labels=labels)
        limit = GaugeMetricFamily("prefixgate_memo_bytes_limit",
                                  "The byte bound of a memo (limits.*_bytes)", labels=labels)
        fallbacks = CounterMetricFamily(
            "prefixgate_routing_fallbacks",
            "Requests routing did not analyse as sent, by reason", labels=["model", "reason"])
        truncated = CounterMetricFamily(
            "prefixgate_routing_truncated",
            "Requests of which routing analysed only the leading part (limits.max_routed_*)",
            labels=["model"])
        return entries, size, limit, fallbacks, truncated
