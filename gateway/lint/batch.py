"""Lint many requests of one app together: what really varies between them.

``BatchLinter.lint(bodies, block_size)`` lints each request alone, then groups
them the way the gateway groups live traffic (model, tenant, template shape:
the leading system messages and the set of tool names) and compares each
group's stable prefix — system/developer messages and tool strings — field
by field (``variance``):

* the spans that differ become ``varying`` spans of the group, and a warning
  in every request where no pattern already covered them;
* pattern hits on text that is the same in every request (a fixed date in a
  policy text) drop to ``info``; hits on varying text are confirmed;
* the requests' rendered prompts give the group's common prefix in tokens;
* tool order that changes between requests, tool JSON that differs only in
  a key order the rendered prompt keeps (vLLM rebuilds each function tool's
  outer keys in a fixed order), text that differs only in invisible
  characters and a ``cache_salt`` unique per request are group findings; an
  invisible difference is also a warning in each request that carries the
  odd form (CRLF beside LF, a no-break space beside a space).

Requests are compared when they share model, tenant (``user``) and shape.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import groupby
from typing import Any

import orjson

from engine.tokenizer import template_tools
from gateway.lint.linter import Analysis, Linter, floor_blocks, make_report
from gateway.lint.model import STRUCTURE_KINDS, BatchReport, Finding, GroupReport, VaryingSpan
from gateway.lint.structure import TextField, leading_system, message_text, tool_names
from gateway.lint.suggest import SUGGESTIONS, suggestion
from gateway.lint.textdiff import common_prefix
from gateway.lint.variance import Atomizer, Variance

EXAMPLES = 5
DOCUMENT_WORDS = 40
"""A varying span whose values mostly run to this many words or more is a passage that
differs per request (retrieved documents, search results, a user's record): reported as
one ``document`` span, the dates, names and numbers inside it not as findings of their
own (each retrieved passage has some)."""


TOOLS_MARK = "; tools: "


def shape_of(body: Mapping[str, Any]) -> str:
    messages = body.get("messages") or []
    names = sorted(n for n in tool_names(body.get("tools")) if n)
    return f"{leading_system(messages)} system{TOOLS_MARK}{','.join(names) or '-'}"


def redacted_shape(shape: str, digest: Callable[[str], str]) -> str:
    """``shape_of``'s text with the tool names replaced by their count and ``digest``
    of them: what a caller who may not read prompts sees of a group."""
    head, mark, names = shape.partition(TOOLS_MARK)
    if not mark or names == "-":
        return shape
    return f"{head}{mark}{len(names.split(','))} (names hidden, {digest(names)})"


@dataclass(frozen=True, slots=True)
class Compared:
    """One field of the stable prefix across a group's requests."""

    key: str
    paths: list[str]
    texts: list[str]


class BatchLinter:
    def __init__(self, linter: Linter, atomizer: Atomizer) -> None:
        self.linter = linter
        self.atomizer = atomizer

    def lint(self, bodies: Sequence[Mapping[str, Any]], block_size: int) -> BatchReport:
        analyses = [self.linter.analyze(body, block_size) for body in bodies]
        groups: dict[tuple[str, str, str], list[int]] = {}
        for index, body in enumerate(bodies):
            model = str(body.get("model") or "")
            tenant = str(body.get("user") or "")
            groups.setdefault((model, tenant, shape_of(body)), []).append(index)
        findings: list[list[Finding]] = [list(a.report.findings) for a in analyses]
        reports = []
        for (_, _, shape), members in groups.items():
            reports.append(self._group(shape, members, analyses, findings, block_size))
        final = tuple(make_report(a.report.model, block_size, a.prompt.total, a.stable_tokens,
                                  findings[i], _passage_tokens(a, findings[i]))
                      for i, a in enumerate(analyses))
        return BatchReport(final, tuple(reports))

    # -- one group -----------------------------------------------------------------------------

    def _group(self, shape: str, members: list[int], analyses: list[Analysis],
               findings: list[list[Finding]], block_size: int) -> GroupReport:
        group = [analyses[i] for i in members]
        n = len(members)
        common = min((common_prefix(group[0].rendered, a.rendered) for a in group[1:]),
                     default=len(group[0].rendered))
        common_tokens = min(group[0].prompt.token_at(common), group[0].prompt.total)
        varying: list[VaryingSpan] = []
        group_findings = self._shape_findings(group)
        if n >= 2:
            for compared in self._compared(group):
                if len(set(compared.texts)) == 1:
                    for i in members:
                        findings[i] = [_demote(f, n) if _on(f, compared, members.index(i)) else f
                                       for f in findings[i]]
                    continue
                spans, invisible = self._vary(compared, members, analyses, findings)
                varying.extend(spans)
                if invisible:
                    group_findings.append(invisible)
        return GroupReport(tuple(members), shape, common_tokens,
                           floor_blocks(common_tokens, block_size), tuple(varying),
                           tuple(group_findings))

    def _compared(self, group: list[Analysis]) -> list[Compared]:
        by_key: list[dict[str, tuple[str, str]]] = []
        for analysis in group:
            keyed: dict[str, tuple[str, str]] = {}
            messages = analysis.body.get("messages") or []
            for index in range(leading_system(messages)):
                keyed[f"system{index}"] = (f"messages[{index}].content",
                                           message_text(messages[index]))
            names = tool_names(analysis.body.get("tools"))
            for field in analysis.fields:
                if field.region == "tools" and field.tool is not None:
                    inner = field.path.split("]", 1)[1]
                    keyed[f"tool:{names[field.tool]}{inner}"] = (field.path, field.text)
            by_key.append(keyed)
        out = []
        for key in by_key[0]:
            if all(key in keyed for keyed in by_key):
                out.append(Compared(key, [k[key][0] for k in by_key], [k[key][1] for k in by_key]))
        return out

    def _vary(self, compared: Compared, members: list[int], analyses: list[Analysis],
              findings: list[list[Finding]]) -> tuple[list[VaryingSpan], Finding | None]:
        """The field's varying spans, each marked in every request; spans that differ only
        in invisible characters (spaces, line endings, zero-width and no-break characters)
        are marked in the requests that carry the odd form instead, and the first of them
        is also returned as the group's finding."""
        variance = Variance(self.atomizer, compared.texts[0])
        alignments = [variance.align(compared.texts[0])]
        alignments += [variance.observe(text) for text in compared.texts[1:]]
        slots = _widened(variance.slots(), [f for f in findings[members[0]]
                                            if _on(f, compared, 0)])
        out = []
        invisible: list[tuple[list[tuple[int, int]], list[str]]] = []
        marked: list[list[tuple[int, int]]] = [[] for _ in members]
        for slot in slots:
            spans = [variance.value(a, slot) for a in alignments]
            values = [a.text[s:e] for a, (s, e) in zip(alignments, spans)]
            if len(set(values)) == 1:
                continue
            if all(_is_invisible(v) for v in values):
                invisible.append((spans, values))
                continue
            if not all(values):  # text inserted or left out: show it with the next word
                slot = variance.grown(slot)
                spans = [variance.value(a, slot) for a in alignments]
                values = [a.text[s:e] for a, (s, e) in zip(alignments, spans)]
            seen = [f.kind for position, index in enumerate(members) for f in findings[index]
                    if f.path == compared.paths[position] and f.kind not in STRUCTURE_KINDS
                    and f.start < spans[position][1] and f.end > spans[position][0]]
            kind = self._kind(values, seen)
            distinct = list(dict.fromkeys(values))
            start, end = spans[0]
            path = compared.paths[0]
            out.append(VaryingSpan(path, start, end, values[0], kind, len(distinct),
                                   tuple(distinct[:EXAMPLES]),
                                   _token(analyses[members[0]], path, start)))
            for position, index in enumerate(members):
                self._mark(index, compared.paths[position], spans[position], values[position],
                           kind, len(distinct), len(members), analyses, findings)
                marked[position].append(spans[position])
        for position, index in enumerate(members):
            path, alignment = compared.paths[position], alignments[position]
            findings[index] = [
                _demote(f, len(members)) if (
                    f.path == path and f.kind not in STRUCTURE_KINDS
                    and variance.is_stable(alignment, f.start, f.end)
                    and not any(f.start < e and f.end > s for s, e in marked[position]))
                else f for f in findings[index]]
        return out, self._invisible(compared, members, analyses, findings, invisible)

    def _invisible(self, compared: Compared, members: list[int], analyses: list[Analysis],
                   findings: list[list[Finding]],
                   slots: list[tuple[list[tuple[int, int]], list[str]]]) -> Finding | None:
        """Warn, in each request that carries an odd invisible form (the one fewest requests
        share: CRLF beside LF, a no-break or zero-width character beside a space, a trailing
        space), at its first such place in the field; return the group's finding, at the
        first place and request where the requests differ."""
        n = len(members)
        group_finding = None
        warned: set[int] = set()
        for spans, values in slots:
            counts: dict[str, int] = {}
            for value in values:
                counts[value] = counts.get(value, 0) + 1
            usual = max(counts, key=lambda v: (counts[v], _plain(v), -len(v)))
            for position, index in enumerate(members):
                value = values[position]
                if value == usual:
                    continue
                path = compared.paths[position]
                start, end = spans[position]
                text = compared.texts[position]
                problem = _invisible_problem(value, text, end)
                have = "has" if counts[usual] == 1 else "have"
                detail = (f"{_show(value)} here where {counts[usual]} of the {n} requests of "
                          f"this app {have} {_show(usual)}: invisible, yet it changes the "
                          "tokens from here on")
                if group_finding is None:
                    group_finding = Finding(
                        "unicode", value, path, start, end, "warning", 1.0,
                        suggestion("unicode", "system", problem),
                        _token(analyses[index], path, start),
                        detail=f"request {index}: {detail}", request=index)
                if index in warned:
                    continue
                warned.add(index)
                findings[index] = _confirm_invisible(
                    findings[index], Finding(
                        "unicode", value, path, start, end, "warning", 1.0,
                        suggestion("unicode", "system", problem),
                        _token(analyses[index], path, start), detail=detail))
        return group_finding

    def _mark(self, index: int, path: str, span: tuple[int, int], value: str, kind: str,
              distinct: int, n: int, analyses: list[Analysis],
              findings: list[list[Finding]]) -> None:
        """Confirm the pattern hits on a varying span; add a warning where none covered it."""
        start, end = span
        covered = False
        updated = []
        for f in findings[index]:
            if f.path == path and f.start < end and f.end > start and f.kind not in STRUCTURE_KINDS:
                if kind == "document":
                    continue  # the passage is the finding, not what it happens to hold
                covered = True
                f = replace(f, confidence=1.0, severity="warning")
            updated.append(f)
        if not covered and end > start:
            analysis = analyses[index]
            field = _field(analysis, path)
            token = _token(analysis, path, start)
            finding_kind = kind if kind in SUGGESTIONS else "text"
            updated.append(Finding(
                finding_kind, value, path, start, end,
                "info" if field is not None and field.region == "final" else "warning", 1.0,
                suggestion(finding_kind, "system"), token,
                detail=f"varies across {n} requests of this app ({distinct} distinct values)"))
        findings[index] = updated

    def _kind(self, values: list[str], seen: list[str]) -> str:
        """What a varying span holds: a passage of its own (``document``: most values
        ``DOCUMENT_WORDS`` words or more), else what the patterns saw on it in context,
        else a guess from its values (numbers, few repeated values, capitalized words)."""
        present = [v for v in values if v]
        if sum(len(v.split()) >= DOCUMENT_WORDS for v in present) * 2 > len(present):
            return "document"  # a date or a number inside a retrieved passage says nothing
        if seen:
            return max(set(seen), key=seen.count)
        if present and all(v.replace(",", "").replace(".", "").isdigit() for v in present):
            return "counter"
        now = self.linter.clock()
        kinds = []
        for value in present:
            hits = self.linter.detector.scan(value, now)
            best = max(hits, key=lambda h: h.end - h.start, default=None)
            kinds.append(best.kind if best and (best.end - best.start) * 2 >= len(value) else "")
        if kinds and len(set(kinds)) == 1 and kinds[0]:
            return kinds[0]
        distinct = len(set(present))
        if distinct < len(present) and distinct <= max(3, len(present) // 4):
            return "category"  # a tier, a plan, a region: few values, each repeated
        if all(w[:1].isupper() for v in present for w in v.split()) and all(
                len(v.split()) <= 4 for v in present):
            return "name"
        return "text"

    @staticmethod
    def _shape_findings(group: list[Analysis]) -> list[Finding]:
        out: list[Finding] = []
        if len(group) < 2:
            return out
        orders = [tool_names(a.body.get("tools")) for a in group]
        if len(set(orders)) > 1:
            out.append(Finding("tool_order", ", ".join(orders[0]), "tools", 0, 0, "warning", 1.0,
                               suggestion("tool_order", "tools"),
                               detail=f"{len(set(orders))} different tool orders in "
                                      f"{len(group)} requests"))
        by_name: dict[str, set[bytes]] = {}
        canonical: dict[str, set[bytes]] = {}
        for analysis in group:
            tools = analysis.body.get("tools") or []
            # as the template gets them: vLLM rebuilds a function tool's outer keys in a
            # fixed order, so only the order inside its parameters reaches the prompt
            for tool, rendered in zip(tools, template_tools(tools) or []):
                name = tool_names([tool])[0]
                by_name.setdefault(name, set()).add(orjson.dumps(rendered))
                canonical.setdefault(name, set()).add(orjson.dumps(tool, option=orjson.OPT_SORT_KEYS))
        for name, forms in by_name.items():
            if len(forms) > 1 and len(canonical[name]) == 1:
                index = tool_names(group[0].body.get("tools")).index(name)
                out.append(Finding("unstable_json", name, f"tools[{index}]", 0, 0, "warning", 1.0,
                                   suggestion("unstable_json", "tools"),
                                   detail=f"tool {name!r} is sent with {len(forms)} different "
                                          "key orders"))
        salts = [a.body.get("cache_salt") for a in group]
        if all(isinstance(s, str) for s in salts) and len(set(salts)) == len(salts):
            out.append(Finding("cache_salt", str(salts[0]), "cache_salt", 0, len(str(salts[0])),
                               "warning", 1.0, suggestion("cache_salt", "system"), 0,
                               detail=f"a different cache_salt on each of {len(salts)} requests"))
        return out


def _widened(slots: list[tuple[int, int]], hits: list[Finding]) -> list[tuple[int, int]]:
    """Slots grown to the whole of a hit they cut: aligned character by character,
    "王小明" and "李明华" share "明", yet the name varies as a whole."""
    out: list[tuple[int, int]] = []
    for start, end in slots:
        for hit in hits:
            if hit.start < end and hit.end > start:
                start, end = min(start, hit.start), max(end, hit.end)
        if out and start < out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _passage_tokens(analysis: Analysis, findings: list[Finding]) -> int:
    """Tokens of a request's ``document`` spans: the fix moves them after the shared
    prefix, so they are not cacheable once it is made either."""
    total = 0
    for f in findings:
        if f.kind == "document" and f.severity == "warning" and f.token_start is not None:
            end = _token(analysis, f.path, f.end)
            total += max(0, (end if end is not None else f.token_start) - f.token_start)
    return total


def _field(analysis: Analysis, path: str) -> TextField | None:
    return next((f for f in analysis.fields if f.path == path), None)


def _token(analysis: Analysis, path: str, start: int) -> int | None:
    """The prompt token where character ``start`` of the field at ``path`` lands."""
    field = _field(analysis, path)
    offset = analysis.layout.place(field, start) if field else None
    return analysis.prompt.token_at(offset) if offset is not None else None


ZERO_WIDTH = frozenset("\u200b\u200c\u200d\u2060\ufeff")
NO_BREAK = frozenset("\u00a0\u202f\u2007")
CONTROL_NAMES = {"\r": "CR", "\n": "LF", "\t": "TAB", "\x0b": "VT", "\x0c": "FF"}


def _is_invisible(value: str) -> bool:
    """Spaces, line breaks and format characters only (or nothing): what a reader does not
    see, though the tokenizer does."""
    return all(c.isspace() or unicodedata.category(c) == "Cf" for c in value)


def _plain(value: str) -> bool:
    """Plain spacing: single spaces and LF line breaks, no space before a line break."""
    return (all(c in " \n" for c in value) and "  " not in value and " \n" not in value)


def _show(value: str) -> str:
    """An invisible value written out: ``'\\r\\n' (CR, LF)``, ``'\\xa0' (NO-BREAK SPACE)``."""
    if not value:
        return "nothing"
    names = []
    for char, run in groupby(value):
        name = CONTROL_NAMES.get(char) or unicodedata.name(char, "") or f"U+{ord(char):04X}"
        times = len(list(run))
        names.append(f"{name} x{times}" if times > 1 else name)
    return f"{value!r} ({', '.join(names)})"


def _invisible_problem(value: str, text: str, end: int) -> str:
    """Which invisible-character fix applies (``UNICODE``'s keys)."""
    if "\r" in value:
        return "crlf"
    if any(c in ZERO_WIDTH for c in value):
        return "zero_width"
    if any(c in NO_BREAK for c in value):
        return "nbsp"
    if value.strip(" \t") == "" and (end >= len(text) or text[end] in "\r\n"):
        return "trailing_space"
    return "varies"


def _confirm_invisible(findings: list[Finding], found: Finding) -> list[Finding]:
    """``found`` in place of the request's own ``info`` unicode finding on the same span (its
    detail kept), else added."""
    out = []
    covered = False
    for f in findings:
        if (not covered and f.kind == "unicode" and f.path == found.path
                and f.start <= found.start and f.end >= found.end and f.end > f.start):
            covered = True
            f = replace(found, text=f.text, start=f.start, end=f.end,
                        detail=f"{f.detail}; {found.detail}" if f.detail else found.detail)
        out.append(f)
    return out if covered else out + [found]


def _on(finding: Finding, compared: Compared, position: int) -> bool:
    return finding.path == compared.paths[position] and finding.kind not in STRUCTURE_KINDS


def _demote(finding: Finding, n: int) -> Finding:
    if finding.severity != "warning":
        return finding
    return replace(finding, severity="info", confidence=min(finding.confidence, 0.3),
                   detail=(finding.detail + "; " if finding.detail else "")
                   + f"the same in all {n} requests of this app: it does not break the cache")
