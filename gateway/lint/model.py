"""The linter's values: a finding, a report for one request or a batch, a drift event.

All frozen; ``to_json`` gives the API's and the CLI's JSON shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Severity = Literal["warning", "info"]

STRUCTURE_KINDS = frozenset({
    "unstable_json", "tool_order", "unicode", "cache_salt", "template_dynamic",
    "short_prefix", "moved_to_front", "media"})
"""Finding kinds about the request's shape rather than a span of text."""


@dataclass(frozen=True, slots=True)
class Hit:
    """One detected span in a scanned text (offsets in that text)."""

    kind: str
    start: int
    end: int
    confidence: float
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Finding:
    kind: str
    text: str
    path: str
    """JSON path of the field: ``messages[0].content``, ``tools[2].function.parameters``."""
    start: int
    end: int
    """Character offsets in that field (for ``chat_template``: in the rendered prompt)."""
    severity: Severity
    confidence: float
    suggestion: str
    token_start: int | None = None
    """First prompt token the span affects; None when it could not be placed."""
    detail: str = ""
    request: int | None = None
    """For a group's finding: the batch index of the request ``path`` and the offsets are
    in (None: the group's first request)."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind, "text": self.text, "path": self.path, "start": self.start,
            "end": self.end, "token_start": self.token_start, "severity": self.severity,
            "confidence": round(self.confidence, 2), "suggestion": self.suggestion}
        if self.detail:
            out["detail"] = self.detail
        if self.request is not None:
            out["request"] = self.request
        return out


@dataclass(frozen=True, slots=True)
class LintReport:
    """The lint of one request."""

    model: str | None
    """The model (or tokenizer) linted for; None when the CLI could not tell."""
    block_size: int
    prompt_tokens: int
    cacheable_prefix_tokens: int
    """Tokens before the first warning (and before the final turn), in whole KV blocks."""
    cacheable_prefix_tokens_if_fixed: int
    """The same once every warning is fixed: everything before the final turn."""
    findings: tuple[Finding, ...]

    @property
    def warnings(self) -> int:
        return sum(1 for f in self.findings if f.severity == "warning")

    def to_json(self) -> dict[str, Any]:
        return {
            "object": "prompt.lint", "model": self.model, "block_size": self.block_size,
            "prompt_tokens": self.prompt_tokens,
            "cacheable_prefix_tokens": self.cacheable_prefix_tokens,
            "cacheable_prefix_tokens_if_fixed": self.cacheable_prefix_tokens_if_fixed,
            "warnings": self.warnings,
            "findings": [f.to_json() for f in self.findings]}


@dataclass(frozen=True, slots=True)
class VaryingSpan:
    """A span of the shared prefix whose text differs between requests of one group."""

    path: str
    start: int
    end: int
    """Offsets in the field of the group's first request."""
    text: str
    """The value in the group's first request."""
    kind: str
    """What the values look like: ``name``, ``counter``, ``category`` (few values, such as
    a tier), a detector kind (``timestamp`` ...), or ``text``."""
    distinct: int
    """Distinct values seen."""
    examples: tuple[str, ...]
    token_start: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "start": self.start, "end": self.end, "text": self.text,
                "kind": self.kind, "distinct": self.distinct, "examples": list(self.examples),
                "token_start": self.token_start}


@dataclass(frozen=True, slots=True)
class GroupReport:
    """Requests of one app (model + tenant + template shape) compared with each other."""

    requests: tuple[int, ...]
    """Indices into the batch."""
    shape: str
    common_prefix_tokens: int
    """Prompt tokens every request of the group shares."""
    cacheable_common_prefix_tokens: int
    """The same in whole KV blocks: what one request can reuse of another's cache."""
    varying: tuple[VaryingSpan, ...]
    findings: tuple[Finding, ...] = ()
    """Cross-request findings: tool order, unstable tool JSON, per-request cache salt."""

    def to_json(self) -> dict[str, Any]:
        return {"requests": list(self.requests), "shape": self.shape,
                "common_prefix_tokens": self.common_prefix_tokens,
                "cacheable_common_prefix_tokens": self.cacheable_common_prefix_tokens,
                "varying": [v.to_json() for v in self.varying],
                "findings": [f.to_json() for f in self.findings]}


@dataclass(frozen=True, slots=True)
class BatchReport:
    reports: tuple[LintReport, ...]
    groups: tuple[GroupReport, ...]

    @property
    def warnings(self) -> int:
        return (sum(r.warnings for r in self.reports)
                + sum(1 for g in self.groups for f in g.findings if f.severity == "warning"))

    def to_json(self) -> dict[str, Any]:
        model = self.reports[0].model if self.reports else None
        return {"object": "prompt.lint.batch", "model": model, "warnings": self.warnings,
                "requests": [r.to_json() for r in self.reports],
                "groups": [g.to_json() for g in self.groups]}


@dataclass(frozen=True, slots=True)
class SpanSample:
    """One changed span of a drift: its length and a keyed hash; its text only when the
    operator turned on text samples (``lint.text_samples``)."""

    chars: int
    hash: str
    """Keyed per gateway process: equal spans hash equal, a guess cannot be checked."""
    text: str | None = None

    def to_json(self, include_text: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"chars": self.chars, "hash": self.hash}
        if include_text and self.text is not None:
            out["text"] = self.text
        return out


@dataclass(frozen=True, slots=True)
class DriftEvent:
    """A group's stable prefix suddenly shortened: where, by how much, which span changed."""

    at: float
    """Unix time."""
    model: str
    group: str
    """Short opaque id of the group (model + hashed tenant + template shape)."""
    path: str
    """Where the change starts: ``messages[0].content`` or ``tools``."""
    offset: int
    """Character offset in that field where requests now start to differ."""
    stable_chars_before: int
    stable_chars_after: int
    share_before: float
    """Mean share of the prefix that the previous request repeated, before the change."""
    share_after: float
    before: SpanSample
    """The changed span in the last request of the good regime."""
    now: SpanSample
    now_other: SpanSample
    """The same span in another request after the change: the two differ."""
    kind: str
    """What the new span looks like (a detector kind, or ``text``)."""
    lost_chars: int = 0
    lost_tokens: int | None = None

    def to_json(self, include_text: bool = False) -> dict[str, Any]:
        """No prompt text unless ``include_text`` (and the samples were kept)."""
        return {"at": self.at, "model": self.model, "group": self.group, "path": self.path,
                "offset": self.offset, "kind": self.kind,
                "stable_chars_before": self.stable_chars_before,
                "stable_chars_after": self.stable_chars_after,
                "share_before": round(self.share_before, 3),
                "share_after": round(self.share_after, 3),
                "lost_tokens": self.lost_tokens,
                "before": self.before.to_json(include_text),
                "now": self.now.to_json(include_text),
                "now_other": self.now_other.to_json(include_text)}


@dataclass(frozen=True, slots=True)
class FindingStat:
    """How often one kind of finding was seen in live traffic (no prompt text)."""

    kind: str
    count: int
    severity: Severity
    suggestion: str
