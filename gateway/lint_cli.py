"""``prefixgate lint FILE``: lint prompts before they ship (CI, pre-commit).

FILE (or ``-`` for stdin) holds one chat request, a JSON list of requests,
``{"requests": [...]}``, or a JSONL log with one request per line (or a
``{"body": ...}`` / ``{"request": ...}`` record per line). Several requests
are also compared with each other: what really varies between them.

Output is for people by default, ``--json`` for tools. The exit status is 1
when any warning is found (something breaks prefix caching), 0 when none,
2 when the input cannot be read or rendered.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

from engine.tokenizer import RenderError, bundled_qwen_tokenizer_dir, load_renderer

from .lint.batch import BatchLinter
from .lint.detect import Detector
from .lint.linter import Linter
from .lint.model import BatchReport, Finding, LintReport
from .lint.template import ClockProbe, read_template
from .lint.tokens import ByteEncoder, HFEncoder, TokenMap
from .lint.variance import Atomizer


class InputError(ValueError):
    pass


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="prefixgate lint",
        description="Find what in your prompts breaks vLLM prefix caching.")
    p.add_argument("file", help="a chat request, a list of them, or a JSONL log ('-': stdin)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--tokenizer", help="Hugging Face tokenizer folder with the chat template "
                                       "(default: the bundled Qwen3 tokenizer)")
    p.add_argument("--block-size", type=int, default=16, help="KV block size (default 16)")
    p.add_argument("--model", help="model name to show in the report")
    p.add_argument("--now", help="pretend it is this ISO-8601 time (reproducible output)")
    return p


def read_requests(text: str) -> tuple[list[dict[str, Any]], bool]:
    """The requests in a file, and whether it was a single request."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = None
    if isinstance(data, dict) and "messages" in data:
        return [data], True
    if isinstance(data, dict) and isinstance(data.get("requests"), list):
        return [_request(r, i) for i, r in enumerate(data["requests"])], False
    if isinstance(data, list):
        return [_request(r, i) for i, r in enumerate(data)], False
    requests = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            requests.append(_request(json.loads(line), number))
        except json.JSONDecodeError as exc:
            raise InputError(f"line {number}: not JSON ({exc.msg})") from None
    if not requests:
        raise InputError("no chat request found")
    return requests, False


def _request(value: Any, where: int) -> dict[str, Any]:
    if isinstance(value, dict):
        for key in ("body", "request"):
            if isinstance(value.get(key), dict) and "messages" in value[key]:
                return value[key]
        if isinstance(value.get("messages"), list):
            return value
    raise InputError(f"item {where}: not a chat request (no messages)")


def build_linter(tokenizer: str | None, model: str | None, now: float | None) -> Linter:
    folder = tokenizer or bundled_qwen_tokenizer_dir()
    renderer = load_renderer(folder)
    encoder = HFEncoder(folder) if folder else ByteEncoder()
    name = model or (os.path.basename(os.path.normpath(folder)) if folder else "bytes")
    clock = (lambda: now) if now is not None else None
    return Linter(name, renderer, TokenMap(encoder), read_template(folder), Detector(),
                  ClockProbe(), **({"clock": clock} if clock else {}))


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        now = dt.datetime.fromisoformat(args.now).timestamp() if args.now else None
        if args.file == "-":
            text = sys.stdin.read()
        else:
            with open(args.file, encoding="utf-8") as handle:
                text = handle.read()
        requests, single = read_requests(text)
        linter = build_linter(args.tokenizer, args.model, now)
        if single:
            report: LintReport | BatchReport = linter.lint(requests[0], args.block_size)
        else:
            report = BatchLinter(linter, Atomizer()).lint(requests, args.block_size)
    except (OSError, ValueError, RenderError) as exc:  # InputError is a ValueError
        print(f"prefixgate lint: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_json(), ensure_ascii=False, indent=2))
    else:
        print(render_text(report, args.file))
    return 1 if report.warnings else 0


def render_text(report: LintReport | BatchReport, name: str) -> str:
    lines: list[str] = []
    if isinstance(report, LintReport):
        _report_lines(report, name, lines)
    else:
        for index, single in enumerate(report.reports):
            if single.findings:
                _report_lines(single, f"{name} request {index}", lines)
        for group in report.groups:
            lines.append(f"group of {len(group.requests)} request(s) [{group.shape}]: "
                         f"{group.common_prefix_tokens} tokens in common, "
                         f"{group.cacheable_common_prefix_tokens} reusable from cache")
            for span in group.varying:
                examples = ", ".join(repr(e) for e in span.examples)
                lines.append(f"  varies   {span.kind:<10} {span.path}:{span.start}-{span.end}"
                             f"  token {span.token_start}  {span.distinct} values: {examples}")
            for finding in group.findings:
                lines.extend(_finding_lines(finding))
    warnings = report.warnings
    lines.append(f"{warnings} warning(s)" + (": these break prefix caching" if warnings else
                                             ": nothing breaks prefix caching"))
    return "\n".join(lines)


def _report_lines(report: LintReport, name: str, lines: list[str]) -> None:
    lines.append(f"{name}: {report.prompt_tokens} prompt tokens; cacheable prefix "
                 f"{report.cacheable_prefix_tokens} tokens, "
                 f"{report.cacheable_prefix_tokens_if_fixed} if fixed "
                 f"(KV block {report.block_size})")
    for finding in report.findings:
        lines.extend(_finding_lines(finding))


def _finding_lines(finding: Finding) -> list[str]:
    token = f"token {finding.token_start}" if finding.token_start is not None else "token ?"
    text = finding.text if len(finding.text) <= 60 else finding.text[:59] + "…"
    head = (f"  {finding.severity:<8} {finding.kind:<16} {finding.path}:{finding.start}-"
            f"{finding.end}  {token}  {text!r}")
    body = finding.suggestion + (f" ({finding.detail})" if finding.detail else "")
    return [head] + textwrap.wrap(body, width=96, initial_indent=" " * 11,
                                  subsequent_indent=" " * 11)
