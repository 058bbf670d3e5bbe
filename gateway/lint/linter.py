"""Lint one chat request: findings with JSON path, span, tokens, severity and fix.

``Linter.lint(body, block_size)``:

1. Every text field (``structure.text_fields``) is scanned by the detector and
   checked for invisible Unicode; tools for unstable JSON; ``cache_salt`` for
   a per-request value. ``field_findings`` is this step alone: cheap, no
   tokenizer, what the gateway runs on live traffic.
2. The request is rendered with the model's chat template; a template that
   writes the current date is found by ``template.ClockProbe``. Parts that are
   not text (an image, audio, a video, a file) are left out of that rendering,
   each noted as a ``media`` info: vLLM turns them into tokens of its own.
3. Every finding is placed in the rendered prompt (``layout``) and on its
   tokens (``tokens``).

Severity: ``warning`` for a likely-dynamic span (confidence >= 0.5) in the
stable prefix (system prompt, tools, earlier turns): it ends the part of the
prompt a later request can reuse. ``info`` in the final turn (new on every
request anyway), for a person's own details in earlier turns (a name, an
order number the user typed: that conversation's next turn reuses them, and
no other conversation shares those turns), for low-confidence hits, and for
hygiene issues that only break the cache when another request differs
(Unicode, key order).

``cacheable_prefix_tokens`` = tokens before the first warning, and before the
final turn, rounded down to whole KV blocks; ``..._if_fixed`` the same with
no warning left: the tokens before the final turn (less a passage that differs per
request, a ``document`` span, which the fix moves after the shared prefix).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from engine.tokenizer import MERGED, Renderer
from gateway.lint.detect import Detector
from gateway.lint.layout import Layout
from gateway.lint.model import Finding, LintReport, Severity
from gateway.lint.structure import (
    TextField,
    final_start,
    leading_system,
    media_parts,
    text_fields,
    tool_findings,
    unicode_findings,
    without_media,
)
from gateway.lint.suggest import suggestion
from gateway.lint.template import ClockProbe, TemplateSource
from gateway.lint.tokens import PromptTokens, TokenMap

WARN_CONFIDENCE = 0.5
SALT_KINDS = frozenset({"uuid", "ulid", "request_id", "session_id", "nonce", "timestamp", "epoch"})


@dataclass(frozen=True, slots=True)
class Analysis:
    """A linted request and what it was linted from (the batch compares these)."""

    body: Mapping[str, Any]
    fields: list[TextField]
    rendered: str
    layout: Layout
    prompt: PromptTokens
    stable_tokens: int
    """Tokens before the final turn."""
    report: LintReport


PERSONAL_KINDS = frozenset({"name", "email", "phone", "record_id"})


def severity(region: str, confidence: float, kind: str = "") -> Severity:
    if region == "final" or confidence < WARN_CONFIDENCE:
        return "info"
    return "info" if region == "history" and kind in PERSONAL_KINDS else "warning"


def floor_blocks(tokens: int, block_size: int) -> int:
    return tokens - tokens % block_size if block_size > 0 else tokens


class FieldLinter:
    """Step 1 alone: text and request shape, no tokenizer (what runs on live traffic)."""

    def __init__(self, detector: Detector) -> None:
        self.detector = detector

    def field_findings(self, field: TextField, now: float) -> list[Finding]:
        out = [Finding(hit.kind, field.text[hit.start:hit.end], field.path, hit.start, hit.end,
                       severity(field.region, hit.confidence, hit.kind), hit.confidence,
                       suggestion(hit.kind, field.region), detail=hit.detail)
               for hit in self.detector.scan(field.text, now)]
        out.extend(unicode_findings(field))
        return out

    def request_findings(self, body: Mapping[str, Any], now: float) -> list[Finding]:
        """Findings about the request as a whole: tools' JSON, the cache salt."""
        out = tool_findings(body.get("tools"))
        salt = body.get("cache_salt")
        if isinstance(salt, str) and salt:
            kinds = {h.kind for h in self.detector.scan(salt, now)}
            if kinds & SALT_KINDS or self.detector.ids.looks_random(salt, 12):
                out.append(Finding("cache_salt", salt, "cache_salt", 0, len(salt), "warning", 0.6,
                                   suggestion("cache_salt", "system"), token_start=0,
                                   detail="looks unique per request"))
        return out


class Linter(FieldLinter):
    def __init__(self, model: str | None, renderer: Renderer | None, tokens: TokenMap,
                 template: TemplateSource, detector: Detector, probe: ClockProbe,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(detector)
        self.model = model
        self.renderer = renderer
        self.tokens = tokens
        self.template = template
        self.probe = probe
        self.clock = clock

    # -- all steps ------------------------------------------------------------------------------

    def lint(self, body: Mapping[str, Any], block_size: int) -> LintReport:
        """Raises ``engine.tokenizer.RenderError`` when the request cannot be rendered."""
        return self.analyze(body, block_size).report

    def analyze(self, body: Mapping[str, Any], block_size: int) -> Analysis:
        now = self.clock()
        fields = text_fields(body)
        messages = body.get("messages") or []
        media = media_parts(body)
        body = without_media(body, media)  # what is rendered: vLLM's own tokens for media
        rendered = self.renderer.render_chat(body) if self.renderer else ""
        layout = Layout(rendered, body, self.renderer)
        prompt = self.tokens.index(rendered)
        findings: list[Finding] = []
        for field in fields:
            for finding in self.field_findings(field, now):
                offset = layout.place(field, finding.start)
                token = prompt.token_at(offset) if offset is not None else None
                findings.append(_with_token(finding, token))
        findings.extend(_with_token(f, 0 if f.kind == "cache_salt" else None)
                        for f in self.request_findings(body, now))
        findings.extend(self._moved_to_front(body, fields, layout, prompt))
        findings.extend(_media_findings(media, layout, prompt))
        span = self.probe.injected_span(self.template, body, rendered) if rendered else None
        if span is not None:
            findings.append(Finding(
                "template_dynamic", rendered[span[0]:span[1]], "chat_template", span[0], span[1],
                "warning", 0.95, suggestion("template_dynamic", "system"),
                token_start=prompt.token_at(span[0]),
                detail="the chat template fills this from the clock (strftime_now)"))
        stable_tokens = prompt.token_at(layout.final_offset(final_start(messages), messages))
        if not rendered:
            stable_tokens = 0
        stable_tokens = min(stable_tokens, prompt.total)
        if 0 < stable_tokens < block_size:
            findings.append(Finding(
                "short_prefix", "", "messages", 0, 0, "info", 1.0,
                suggestion("short_prefix", "system"), token_start=0,
                detail=f"{stable_tokens} stable tokens < block size {block_size}"))
        report = make_report(self.model, block_size, prompt.total, stable_tokens, findings)
        return Analysis(body, fields, rendered, layout, prompt, stable_tokens, report)


    def _moved_to_front(self, body: Mapping[str, Any], fields: Sequence[TextField],
                        layout: Layout, prompt: PromptTokens) -> list[Finding]:
        """System and developer messages after the conversation's start that vLLM merges
        into the system prompt in front (a developer message with a template that has no
        such role: ``engine.tokenizer.developer_as_system``): the request that adds one
        changes the prompt where its text lands, and all that follows is recomputed."""
        messages = body.get("messages")
        if self.renderer is None or not isinstance(messages, list):
            return []
        read = self.renderer.as_vllm_reads(body).get("messages")
        if (read is messages or not isinstance(read, list) or not read
                or not isinstance(read[0], Mapping) or not read[0].get(MERGED)):
            return []
        out: list[Finding] = []
        for index in range(leading_system(messages), len(messages)):
            message = messages[index]
            role = message.get("role") if isinstance(message, Mapping) else None
            if role not in ("system", "developer"):
                continue
            field = next((f for f in fields if f.message == index), None)
            offset = layout.place(field, 0) if field is not None else None
            out.append(Finding(
                "moved_to_front", role, f"messages[{index}].role", 0, len(role), "warning",
                0.9, suggestion("moved_to_front", "history"),
                token_start=prompt.token_at(offset) if offset is not None else None,
                detail="vLLM renders it inside the system prompt at the front: this model's "
                       "chat template has no developer role"))
        return out


def _media_findings(media: Sequence[tuple[int, int, str]], layout: Layout,
                    prompt: PromptTokens) -> list[Finding]:
    """One ``info`` per part that is not text: left out of the lint and of the token
    count (vLLM expands it into tokens of its own)."""
    out = []
    for index, part, kind in media:
        offset = layout.message_at.get(index)
        out.append(Finding(
            "media", kind, f"messages[{index}].content[{part}]", 0, 0, "info", 1.0,
            suggestion("media", "system"),
            token_start=prompt.token_at(offset) if offset is not None else None,
            detail=f"{kind}: not linted, not in the token counts"))
    return out


def make_report(model: str | None, block_size: int, prompt_tokens: int, stable_tokens: int,
                findings: list[Finding], passage_tokens: int = 0) -> LintReport:
    """``passage_tokens``: tokens of the passages that differ per request (``document``
    findings), which stay out of the cacheable prefix once fixed too (moved after it)."""
    first_warning = min((f.token_start if f.token_start is not None else stable_tokens
                         for f in findings if f.severity == "warning"), default=stable_tokens)
    ordered = sorted(findings, key=lambda f: (
        f.token_start if f.token_start is not None else 1 << 62, f.path, f.start))
    return LintReport(
        model=model, block_size=block_size, prompt_tokens=prompt_tokens,
        cacheable_prefix_tokens=floor_blocks(min(first_warning, stable_tokens), block_size),
        cacheable_prefix_tokens_if_fixed=floor_blocks(max(0, stable_tokens - passage_tokens),
                                                      block_size),
        findings=tuple(ordered))


def _with_token(finding: Finding, token: int | None) -> Finding:
    return replace(finding, token_start=token)
