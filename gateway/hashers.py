"""One :class:`PromptHasher` per served model, built from the model settings.

A model with a configured tokenizer folder renders with its real chat
template; any other model falls back to the byte renderer, which keeps the
approximate index consistent (equal prompts, equal hashes) but does not match
the engine's token ids — the precise policy needs the real tokenizer, and a
warning says so.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine.tokenizer import ByteRenderer, load_renderer

from .config import ModelSettings
from .prefix import PromptHasher

log = logging.getLogger("prefixgate.hashers")


class HasherSet:
    def __init__(self, models: list[ModelSettings]) -> None:
        self._hashers: dict[str, PromptHasher] = {}
        for model in models:
            if model.name not in self._hashers:
                self._hashers[model.name] = PromptHasher(load_renderer(model.tokenizer))
                log.info("model %s: tokenizer %s", model.name, model.tokenizer or "byte fallback")
        self._fallback: PromptHasher | None = None

    def get(self, model: str) -> PromptHasher:
        hasher = self._hashers.get(model)
        if hasher is not None:
            return hasher
        if self._fallback is None:
            log.warning("no tokenizer configured for model %s: hashing byte-level", model)
            self._fallback = PromptHasher(ByteRenderer())
        return self._fallback

    def has_tokenizer(self, model: str) -> bool:
        return model in self._hashers

    def items(self) -> list[tuple[str, PromptHasher]]:
        return list(self._hashers.items())


class HasherCollector(Collector):
    """Incremental chat rendering per model, read at scrape time."""

    def __init__(self, hashers: HasherSet) -> None:
        self.hashers = hashers

    def collect(self) -> Iterator[Metric]:
        enabled = GaugeMetricFamily(
            "prefixgate_incremental_render_enabled",
            "1 when follow-ups are rendered from the last known turn (template verified).",
            labels=["model"])
        renders = CounterMetricFamily(
            "prefixgate_incremental_renders",
            "Chat requests rendered from a known turn instead of whole.", labels=["model"])
        failures = CounterMetricFamily(
            "prefixgate_render_audit_failures",
            "Sampled incremental renders that disagreed with a full render.", labels=["model"])
        for model, hasher in self.hashers.items():
            memo = hasher.conversations
            enabled.add_metric([model], 1.0 if memo is not None and memo.enabled else 0.0)
            renders.add_metric([model], memo.incremental if memo is not None else 0)
            failures.add_metric([model], memo.audit_failures if memo is not None else 0)
        yield from (enabled, renders, failures)
