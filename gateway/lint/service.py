"""The prompt linter inside the gateway: the endpoint's engine, live traffic, drift.

``LintService`` is built once at start-up (``gateway.server.parts``); on live traffic it is fed
by ``gateway.server.live_lint`` (a lifecycle observer and its worker thread).

* ``lint_one`` / ``lint_batch`` serve ``POST /v1/prompt/lint`` (run in a
  worker thread: they render and tokenize). The model's tokenizer offsets
  are loaded on first use.
* ``check_now`` lints one routed chat request's stable prefix, in the live
  linter's worker thread (it takes its own locks): its fields with the
  detector only, memoized by (path, hash of the text) — a warm system prompt
  and tool list cost a hash each. The request is then observed by its group
  (``groups``): spans that never vary drop to info, a per-request cache salt
  or a changed tool order count as warnings, and a drift is logged, counted
  and kept for ``GET /admin/drift``. ``known_warnings`` is what the last
  lint of a stable prefix found (a hash and a lookup: on the serving loop,
  for the ``x-prefixgate-lint`` header).
* ``top_findings`` and ``drift_events`` feed the ops dashboard;
  ``drift_report`` is ``GET /admin/drift``.

No prompt text leaves the service by default: a drift is logged and
reported as positions, lengths and keyed hashes (``SpanSample``), and what a
group learned as offsets, lengths and counts. With ``text_samples`` (the
``lint.text_samples`` setting) the changed spans' text is kept too, and
shown only where the caller passes ``include_text=True`` (the route does so
for admin keys). The hashes are keyed with a random key per process, so a
guess of a value cannot be checked against one.

Nothing here may fail a request: the live linter logs what it cannot lint.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson
import xxhash

from gateway.config import ModelSettings
from gateway.lint.batch import BatchLinter, redacted_shape, shape_of
from gateway.lint.detect import Detector
from gateway.lint.drift import Drift, DriftSettings
from gateway.lint.groups import Group, GroupTable, Prefix
from gateway.lint.linter import FieldLinter, Linter
from gateway.lint.model import BatchReport, DriftEvent, Finding, FindingStat, LintReport, SpanSample
from gateway.lint.structure import TextField, prefix_fields, tool_names
from gateway.lint.suggest import suggestion
from gateway.lint.template import ClockProbe, TemplateSource, read_template
from gateway.lint.tokens import ByteEncoder, HFEncoder, TokenMap
from gateway.lint.variance import Atomizer
from gateway.ops.metrics import GatewayMetrics
from gateway.prompt.hashers import HasherSet
from policies.lru import LRU

log = logging.getLogger("prefixgate.lint")


@dataclass(frozen=True, slots=True)
class LintLimits:
    max_groups: int = 128
    max_prefix_chars: int = 32768
    memo_entries: int = 4096
    memo_seconds: float = 3600.0
    """Field findings are recomputed after this long (date confidence follows the clock)."""
    min_seen: int = 5
    """Requests a group must have sent before a never-varying span is called stable."""
    max_events: int = 100
    learn: bool = True
    """Live learning: group each app's requests, learn the spans that vary, report
    prefix drift. Off, each request is linted on its own (patterns only)."""
    text_samples: bool = False
    """Keep the text of drifted and varying spans for admin callers (off: lengths and
    hashes only)."""
    compiled_templates: int = 64
    compiled_template_bytes: int = 32 << 20
    """The clock probe's compiled chat templates, at most (entries, estimated bytes)."""


@dataclass(slots=True)
class Examined:
    """What the lint of one live request found (``LintService.examine``)."""

    warnings: list[str]
    """The kind of each warning."""
    drifts: list[DriftEvent]
    """The prefix drifts the request revealed (at most one)."""


class LintService:
    def __init__(self, hashers: HasherSet, models: list[ModelSettings],
                 metrics: GatewayMetrics | None = None,
                 clock: Callable[[], float] = time.time, limits: LintLimits | None = None,
                 drift: DriftSettings | None = None) -> None:
        self.hashers = hashers
        self.folders = {m.name: m.tokenizer for m in models}
        self.metrics = metrics
        self.clock = clock
        self.limits = limits = limits or LintLimits()
        self.detector = Detector()
        self.fields = FieldLinter(self.detector)
        self.clock_probe = ClockProbe(limits.compiled_templates, limits.compiled_template_bytes)
        self.atomizer = Atomizer()
        self.drift_settings = drift or DriftSettings()
        self.groups = GroupTable(self.atomizer, self.drift_settings, limits.max_groups,
                                 limits.max_prefix_chars)
        self._linters: dict[str, Linter] = {}
        self._templates: dict[str, TemplateSource] = {}
        self._clock_memo: dict[tuple[str, int], bool] = {}
        self._memo: LRU[tuple[str, int], tuple[float, list[Finding]]] = LRU(
            limits.memo_entries)
        self._last_counts: LRU[int, int] = LRU(limits.memo_entries)
        """Warnings of the last lint of each (model, tenant, stable prefix)."""
        self._stats: dict[str, int] = {}
        self._events: deque[DriftEvent] = deque(maxlen=limits.max_events)
        self._lock = threading.Lock()
        self._sample_key = secrets.token_bytes(16)

    def memos(self) -> dict[str, LRU[Any, Any]]:
        """The linter's memos whose size ``/metrics`` reports (``gateway.ops.memo_metrics``)."""
        return {"compiled_templates": self.clock_probe.compiled}

    # -- the endpoint ------------------------------------------------------------------------

    @property
    def notes(self) -> list[str]:
        """What goes unchecked for want of an extra (``gateway.lint.people.NAMES_NOTICE``)."""
        notice = self.detector.people.notice
        return [notice] if notice else []

    def linter(self, model: str) -> Linter:
        with self._lock:
            linter = self._linters.get(model)
        if linter is not None:
            return linter
        folder = self.folder(model)
        encoder = HFEncoder(folder) if folder else ByteEncoder()
        linter = Linter(model, self.hashers.get(model).renderer, TokenMap(encoder),
                        self.template(model), self.detector, self.clock_probe, self.clock)
        with self._lock:
            return self._linters.setdefault(model, linter)

    def folder(self, model: str) -> str | None:
        """The model's tokenizer folder: configured, or as the gateway discovered it."""
        choice = self.hashers.choice(model)
        return choice.path if choice is not None else self.folders.get(model)

    def template(self, model: str) -> TemplateSource:
        source = self._templates.get(model)
        if source is None:
            source = read_template(self.folder(model))
            self._templates[model] = source
        return source

    def lint_one(self, model: str, body: Mapping[str, Any], block_size: int) -> LintReport:
        return self.linter(model).lint(body, block_size)

    def lint_batch(self, model: str, bodies: Sequence[Mapping[str, Any]],
                   block_size: int) -> BatchReport:
        return BatchLinter(self.linter(model), self.atomizer).lint(bodies, block_size)

    # -- live traffic ------------------------------------------------------------------------

    def check_now(self, model: str, body: Mapping[str, Any], tenant: str | None,
                  fields: list[TextField] | None = None, blocking: bool = True) -> int:
        """Lint one routed request and keep what it found (``examine``, then ``record``)."""
        if fields is None:
            fields = prefix_fields(body)
        examined = self.examine(model, body, tenant_id(tenant), fields, blocking)
        self.record(prefix_key(model, tenant, fields), examined)
        return len(examined.warnings)

    def examine(self, model: str, body: Mapping[str, Any], tenant_hash: str,
                fields: list[TextField], blocking: bool = True) -> Examined:
        """What one request's stable prefix shows, learning from it; nothing is counted or
        kept for the operators here (``record`` does that, in the process that serves).
        ``body`` needs only what ``lint_view`` keeps; ``tenant_hash`` is ``tenant_id(tenant)``."""
        now = self.clock()
        findings: list[Finding] = []
        for field in fields:
            findings.extend(self._field_findings(field, now))
        findings.extend(self.fields.request_findings(body, now))
        drifts: list[DriftEvent] = []
        if self.limits.learn:
            prefix = Prefix.of(fields, self.limits.max_prefix_chars)
            group = self.groups.get(model, tenant_hash, shape_of(body), prefix)
            findings.extend(self._observe(group, prefix, body, findings, blocking, drifts))
        if self._fills_clock(model, body):
            findings.append(Finding("template_dynamic", "", "chat_template", 0, 0, "warning",
                                    0.95, suggestion("template_dynamic", "system")))
        return Examined([f.kind for f in findings if f.severity == "warning"], drifts)

    def record(self, key: int, examined: Examined) -> None:
        """Keep what a request's lint found: the warnings of its stable prefix (``key``:
        ``prefix_key``) for ``known_warnings``, the counts, the drift events (logged)."""
        kinds: dict[str, int] = {}
        for kind in examined.warnings:
            kinds[kind] = kinds.get(kind, 0) + 1
        self.record_many({key: len(examined.warnings)}, kinds, examined.drifts)

    def record_many(self, counts: Mapping[int, int], kinds: Mapping[str, int],
                    drifts: Sequence[DriftEvent]) -> None:
        """``record`` for many requests at once (what the linter's own process reports):
        the warnings of each prefix key in ``counts``, in the order they were found, the
        warnings of each kind, the drift events."""
        with self._lock:
            for kind, n in kinds.items():
                self._stats[kind] = self._stats.get(kind, 0) + n
            for key, n in counts.items():
                self._last_counts.put(key, n)
            self._events.extend(drifts)
        if self.metrics is not None:
            for kind, n in kinds.items():
                self.metrics.lint_findings.labels(kind).inc(n)
            for event in drifts:
                self.metrics.prefix_drift_events.labels(event.model).inc()
        for event in drifts:
            log.warning("prefix drift in group %s (model %s): requests now differ at %s "
                        "(offset %d, %s); stable prefix %d -> %d chars, share %.0f%% -> "
                        "%.0f%%; changed span %d chars (hash %s), now %d and %d chars "
                        "(hashes %s, %s)", event.group, event.model, event.path, event.offset,
                        event.kind, event.stable_chars_before, event.stable_chars_after,
                        event.share_before * 100, event.share_after * 100, event.before.chars,
                        event.before.hash, event.now.chars, event.now_other.chars,
                        event.now.hash, event.now_other.hash)

    def known_warnings(self, model: str, body: Mapping[str, Any], tenant: str | None,
                       fields: list[TextField] | None = None) -> int | None:
        """The warnings the last lint of this stable prefix found, without linting: a
        hash of the prefix's fields (``prefix_fields(body)``, when not handed in). None
        when the linter has not seen it yet."""
        return self.known(prefix_key(model, tenant,
                                     prefix_fields(body) if fields is None else fields))

    def forget_known(self) -> None:
        """Forget every prefix's warnings (what ``known`` says): the process that told
        them is gone, the next one tells them again."""
        with self._lock:
            self._last_counts.clear()

    def known(self, key: int) -> int | None:
        """``known_warnings`` by the prefix's key (``prefix_key``)."""
        with self._lock:
            return self._last_counts.peek(key)

    def _field_findings(self, field: TextField, now: float) -> list[Finding]:
        key = (field.path, _digest(field.text))
        with self._lock:
            memo = self._memo.get(key)
        if memo is not None and now - memo[0] < self.limits.memo_seconds:
            return memo[1]
        found = self.fields.field_findings(field, now)
        with self._lock:
            self._memo.put(key, (now, found))
        return found

    def _observe(self, group: Group, prefix: Prefix, body: Mapping[str, Any],
                 findings: list[Finding], blocking: bool,
                 drifts: list[DriftEvent]) -> list[Finding]:
        """Learn from the request; demote what never varies; return the group's findings."""
        salt = body.get("cache_salt")
        if not group.lock.acquire(blocking=blocking):
            return []  # a worker is aligning this group's prefix: skip learning, not the request
        try:
            seen = group.observe(prefix, salt if isinstance(salt, str) else None,
                                 tool_names(body.get("tools")), self.limits.min_seen)
            if seen.stable_known and seen.alignment is not None and group.variance is not None:
                for index, finding in enumerate(findings):
                    offset = prefix.offset_of(finding.path)
                    if (finding.severity == "warning" and offset is not None
                            and group.variance.is_stable(seen.alignment, offset + finding.start,
                                                         offset + finding.end)):
                        findings[index] = replace(finding, severity="info")
            if seen.drift is not None:
                drifts.append(self._drift_event(group, prefix, seen.drift))
        finally:
            group.lock.release()
        out = []
        if seen.salt_unique:
            out.append(Finding("cache_salt", "", "cache_salt", 0, 0, "warning", 1.0,
                               suggestion("cache_salt", "system")))
        if seen.order_changed:
            out.append(Finding("tool_order", "", "tools", 0, 0, "warning", 1.0,
                               suggestion("tool_order", "tools")))
        return out

    def _drift_event(self, group: Group, prefix: Prefix, drift: Drift) -> DriftEvent:
        hits = self.detector.scan(drift.new_text, self.clock()) if drift.new_text else []
        kind = max(hits, key=lambda h: h.end - h.start).kind if hits else "text"
        lost = max(0, drift.stable_before - drift.stable_after)
        return DriftEvent(
            at=self.clock(), model=group.model, group=group.id, path=prefix.path_at(drift.offset),
            offset=drift.offset - (prefix.offset_of(prefix.path_at(drift.offset)) or 0),
            stable_chars_before=drift.stable_before, stable_chars_after=drift.stable_after,
            share_before=drift.share_before, share_after=drift.share_after,
            before=self.sample(drift.old_text), now=self.sample(drift.new_text),
            now_other=self.sample(drift.new_text_other), kind=kind, lost_chars=lost,
            lost_tokens=self._tokens(group.model, drift.lost_text))

    def sample(self, text: str) -> SpanSample:
        """A span as reports show it: its length, a keyed hash, its text only when kept."""
        digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8,
                                 key=self._sample_key).hexdigest()
        return SpanSample(len(text), digest, text if self.limits.text_samples else None)

    def _tokens(self, model: str, text: str) -> int | None:
        if not text:
            return 0
        try:
            return len(self.hashers.get(model).renderer.text_token_ids(
                text, add_special_tokens=False))
        except (ValueError, TypeError, RuntimeError):  # a count for the dashboard only
            return None

    def _fills_clock(self, model: str, body: Mapping[str, Any]) -> bool:
        # The clock probe renders the model's template only (a request's own is never
        # rendered): the kwargs are what can change its answer; their hash is the key.
        try:
            kwargs = orjson.dumps(body.get("chat_template_kwargs"), option=orjson.OPT_SORT_KEYS,
                                  default=str)
        except TypeError:  # nested deeper than orjson encodes
            return False
        key = (model, xxhash.xxh3_64_intdigest(kwargs))
        known = self._clock_memo.get(key)
        if known is None:
            known = self.clock_probe.fills_clock(self.template(model), body)
            if len(self._clock_memo) < 1024:
                self._clock_memo[key] = known
        return known

    # -- for operators -------------------------------------------------------------------------

    def top_findings(self, n: int = 10) -> list[FindingStat]:
        with self._lock:
            counts = sorted(self._stats.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
        return [FindingStat(kind, count, "warning", suggestion(kind, "system"))
                for kind, count in counts]

    def drift_events(self, n: int = 20) -> list[DriftEvent]:
        with self._lock:
            return list(self._events)[-n:][::-1]

    def drift_report(self, include_text: bool = False,
                     groups: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """``GET /admin/drift``: events and what each group learned; text only when
        ``include_text`` (a caller who may read prompts) and ``text_samples`` both allow
        it, the groups' tool names only with ``include_text``. ``groups``: the summaries
        of the process that learns (``group_summaries`` there), when it is not this one."""
        return {"text_samples": self.limits.text_samples and include_text,
                "events": [e.to_json(include_text) for e in self.drift_events(100)],
                "groups": self.group_summaries(20, include_text) if groups is None else groups}

    def group_summaries(self, n: int = 20, include_text: bool = False) -> list[dict[str, Any]]:
        out = []
        show = include_text and self.limits.text_samples
        for group in self.groups.snapshot()[:n]:
            if not group.lock.acquire(blocking=False):
                continue
            try:
                varying = [self._varying(slot, show) for slot in group.varying()]
                shape = group.shape if include_text else redacted_shape(
                    group.shape, lambda names: self.sample(names).hash)
                out.append({"group": group.id, "model": group.model, "shape": shape,
                            "requests": group.seen, "varying": varying})
            finally:
                group.lock.release()
        return out

    def _varying(self, slot: dict[str, Any], show: bool) -> dict[str, Any]:
        text, examples = str(slot["text"]), list(slot["examples"])
        out = {"offset": slot["offset"], **self.sample(text).to_json(False),
               "examples": [self.sample(str(e)).to_json(False) for e in examples]}
        if show:
            out["text"], out["example_texts"] = text, examples
        return out


def _digest(text: str) -> int:
    return xxhash.xxh3_64_intdigest(text.encode("utf-8", "surrogatepass"))


def prefix_key(model: str, tenant: str | None, fields: Sequence[TextField]) -> int:
    """Which stable prefix a request has, for ``known_warnings``: model, tenant, fields."""
    digest = xxhash.xxh3_64(f"{model}\x00{tenant_id(tenant)}".encode())
    for field in fields:
        digest.update(b"\x00" + field.path.encode() + b"\x00")
        digest.update(field.text.encode("utf-8", "surrogatepass"))
    return digest.intdigest()


def tenant_id(tenant: str | None) -> str:
    """Who a request's group belongs to: never the key itself, a short hash of it."""
    return xxhash.xxh3_64_hexdigest(tenant.encode("utf-8", "surrogatepass"))[:12] if tenant else "-"
