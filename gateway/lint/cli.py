"""``prefixgate lint FILE...``: lint prompts before they ship (CI, pre-commit).

Each FILE (``-`` for stdin) holds one chat request, a list of requests,
``{"requests": [...]}``, or a log with one request per line (or a
``{"body": ...}`` / ``{"request": ...}`` record per line), as JSON, JSONL
or YAML (``.yaml`` / ``.yml``); an Anthropic Messages API body is linted as
the chat request vLLM renders it (its ``system`` the system prompt, findings
placed on its own paths); a folder stands for the prompt files under
it (``gateway.lint.inputs``). The requests of one file are also compared
with each other: what really varies between them. Files are linted one by
one; a file that cannot be read is reported (where it breaks) and the
others still are.

Every finding is placed at ``FILE:LINE:COLUMN`` (1-based, columns in
characters) from its JSON path and character offset (``lint.locate``).

Formats (``--format``): ``text`` for people, ``json`` (one report per file;
the report itself when one file is given), ``sarif`` (SARIF 2.1.0, one run,
for code-scanning tools; ``lint.sarif``: files that could not be linted are
its invocation's notifications, and its messages quote nothing of the
prompts unless ``--sarif-prompt-text``). ``--json`` is ``--format json``.

Exit status, for CI:

    0  no warning in any file
    1  at least one warning (something breaks prefix caching)
    2  a file could not be read, parsed or rendered, or bad arguments

A closed pipe (``prefixgate lint ... | head -1``) ends the run quietly with
the status it would have had.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from engine.cli_args import CommandParser
from engine.tokenizer import (
    RenderError,
    UnencodableText,
    bundled_qwen_tokenizer_dir,
    load_renderer,
)
from gateway.lint.batch import BatchLinter
from gateway.lint.detect import Detector
from gateway.lint.inputs import EMPTY_FOLDER, InputError, Requests, Target, expand, read_requests
from gateway.lint.linter import Linter
from gateway.lint.locate import join
from gateway.lint.model import BatchReport, Finding, LintReport
from gateway.lint.sarif import Located, Unlinted, sarif_log
from gateway.lint.shapes import batch_in_body, in_body
from gateway.lint.template import ClockProbe, read_template
from gateway.lint.tokens import ByteEncoder, HFEncoder, TokenMap
from gateway.lint.variance import Atomizer
from gateway.version import gateway_version

OK, WARNINGS, FAILED = 0, 1, 2
BUNDLED = "Qwen3 (bundled)"


@dataclass(frozen=True, slots=True)
class Linted:
    name: str
    report: LintReport | BatchReport
    located: list[Located]


def _parser() -> argparse.ArgumentParser:
    p = CommandParser(
        prog="prefixgate lint",
        description="Find what in your prompts breaks vLLM prefix caching.",
        epilog="exit status: 0 no warning, 1 warnings found, 2 a file could not be linted")
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="chat request(s) as JSON, JSONL or YAML ('-': stdin); a folder: "
                        "the prompt files under it")
    p.add_argument("--format", choices=("text", "json", "sarif"), default="text",
                   help="output format (default text)")
    p.add_argument("--json", action="store_const", const="json", dest="format",
                   help="same as --format json")
    p.add_argument("--tokenizer", help="Hugging Face tokenizer folder with the chat template "
                                       "(default: the bundled Qwen3 tokenizer)")
    p.add_argument("--block-size", type=_positive, default=16,
                   help="KV block size in tokens (default 16; vLLM on CPU: 32)")
    p.add_argument("--model", help="model name to show in the report (default: the "
                                   "tokenizer's own name, or none)")
    p.add_argument("--now", help="pretend it is this ISO-8601 time (reproducible output)")
    p.add_argument("--sarif-prompt-text", action="store_true",
                   help="let SARIF messages quote what was found (a timestamp, a tool's "
                        "name); by default they name only the kind, place and fix")
    return p


def _positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be a positive number of tokens, not {value}")
    return number


# -- the linter ------------------------------------------------------------------------------


def tokenizer_name(folder: str | None) -> str | None:
    """The tokenizer's own name (``name_or_path`` in its config), else None."""
    if folder is None:
        return None
    if folder == bundled_qwen_tokenizer_dir():
        return BUNDLED
    for config in ("tokenizer_config.json", "config.json"):
        try:
            with open(os.path.join(folder, config), encoding="utf-8") as handle:
                data = json.load(handle)
        except (OSError, ValueError):
            continue
        for key in ("name_or_path", "_name_or_path"):
            if isinstance(data.get(key), str) and data[key]:
                return str(data[key])
    return None


TOKENIZER_NOTICE = ("tokenizer: no --tokenizer given and the bundled Qwen3 tokenizer is not "
                    "installed (install prefixgate[sim]): tokens counted as UTF-8 bytes")
"""What a run says without any tokenizer: its token positions are bytes, not tokens."""


def notices(linter: Linter, tokenizer: str | None) -> list[str]:
    """What this run does not check for want of an extra: one line each, in every format."""
    out = [] if tokenizer or bundled_qwen_tokenizer_dir() else [TOKENIZER_NOTICE]
    people = linter.detector.people.notice
    return out + ([people] if people else [])


def build_linter(tokenizer: str | None, model: str | None, now: float | None) -> Linter:
    folder = tokenizer or bundled_qwen_tokenizer_dir()
    renderer = load_renderer(folder)
    encoder = HFEncoder(folder) if folder else ByteEncoder()
    clock = (lambda: now) if now is not None else None
    return Linter(model or tokenizer_name(folder), renderer, TokenMap(encoder),
                  read_template(folder), Detector(), ClockProbe(),
                  **({"clock": clock} if clock else {}))


# -- linting and placing ---------------------------------------------------------------------


def lint_file(linter: Linter, target: Target, block_size: int) -> Linted:
    name = target.name
    if name == "-":
        text = sys.stdin.read().removeprefix("\ufeff")
    else:
        with open(name, "rb") as handle:
            text = decoded(handle.read())
    requests = read_requests(text, name)
    report: LintReport | BatchReport
    if requests.single:
        single = in_body(linter.lint(requests.bodies[0], block_size), requests.forms[0])
        report, singles = single, [single]
    else:
        batch = batch_in_body(BatchLinter(linter, Atomizer()).lint(requests.bodies, block_size),
                              requests.forms)
        report, singles = batch, list(batch.reports)
    located = [_place(name, requests, index, finding)
               for index, single in enumerate(singles) for finding in single.findings]
    if isinstance(report, BatchReport):
        located += [_place(name, requests, group.requests[0] if finding.request is None
                           else finding.request, finding)
                    for group in report.groups for finding in group.findings]
    return Linted(name, report, located)


def decoded(raw: bytes) -> str:
    """A prompt file's text: UTF-8, or UTF-16 or UTF-32 with the byte order mark Windows
    editors write, told as JSON's reader tells them (``json.detect_encoding``), the mark
    dropped."""
    codec = json.detect_encoding(raw)
    try:
        return raw.decode(codec)
    except UnicodeDecodeError as exc:
        raise ValueError(f"not {codec.upper().removesuffix('-SIG')} text (byte "
                         f"{exc.start}: {exc.reason}); save it as UTF-8") from None


def _place(name: str, requests: Requests, index: int, finding: Finding) -> Located:
    source, prefix = requests.sources[index], requests.prefixes[index]
    path = join(prefix, finding.path)
    line, column = source.locate(path, finding.start)
    end_line, end_column = source.locate(path, max(finding.start, finding.end))
    return Located(name, finding, line, column, end_line, max(end_column, column))


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        now = dt.datetime.fromisoformat(args.now).timestamp() if args.now else None
        linter = build_linter(args.tokenizer, args.model, now)
    except (OSError, ValueError, RenderError) as exc:
        print(f"prefixgate lint: {exc}", file=sys.stderr)
        return FAILED
    linted: list[Linted] = []
    unlinted: list[Unlinted] = []
    for target in expand(args.files):
        if target.empty_folder:
            unlinted.append(Unlinted(target.name, EMPTY_FOLDER))
            continue
        try:
            linted.append(lint_file(linter, target, args.block_size))
        except (OSError, ValueError, RenderError) as exc:  # InputError is a ValueError
            unlinted.append(_unlinted(target, exc))
    for item in unlinted:
        print(f"prefixgate lint: {item.file}: {item.message}", file=sys.stderr)
    status = FAILED if any(not item.skipped for item in unlinted) else OK
    if status == OK and any(item.report.warnings for item in linted):
        status = WARNINGS
    try:
        for chunk in render(linted, args.format, unlinted, args.sarif_prompt_text,
                            notices(linter, args.tokenizer)):
            sys.stdout.write(chunk)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader left (``| head``): nothing more to say, and Python must not say it
        # either when it flushes stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return status


def _unlinted(target: Target, exc: Exception) -> Unlinted:
    if isinstance(exc, InputError):
        skipped = target.from_folder and exc.no_request
        message = "skipped: no chat request in it" if skipped else str(exc)
        return Unlinted(target.name, message, exc.line, exc.column, skipped)
    if isinstance(exc, OSError):  # its text would repeat the file name
        return Unlinted(target.name, exc.strerror or type(exc).__name__)
    if isinstance(exc, UnencodableText):  # its text is the tokenizer's, as vLLM answers
        return Unlinted(target.name, f"the prompt {exc.explained}")
    return Unlinted(target.name, str(exc))


# -- output ----------------------------------------------------------------------------------


def render(linted: list[Linted], form: str, unlinted: Sequence[Unlinted] = (),
           prompt_text: bool = False, notes: Sequence[str] = ()) -> Iterator[str]:
    """The report; ``notes`` (what went unchecked, ``notices``): SARIF notifications, a
    ``notes`` list in JSON, ``note:`` lines after the text."""
    extra = {"notes": list(notes)} if notes else {}
    if form == "sarif":
        located = [item for file in linted for item in file.located]
        yield json.dumps(sarif_log(located, gateway_version(), unlinted, prompt_text, notes),
                         ensure_ascii=False, indent=2) + "\n"
    elif form == "json":
        if len(linted) == 1:
            yield json.dumps({**_json(linted[0]), **extra}, ensure_ascii=False,
                             indent=2) + "\n"
        else:
            yield json.dumps({"object": "prompt.lint.files",
                              "files": [{"file": f.name, **_json(f)} for f in linted], **extra},
                             ensure_ascii=False, indent=2) + "\n"
    else:
        for file in linted:
            yield render_text(file) + "\n"
        for note in notes:
            yield f"note: {note}\n"


def _json(file: Linted) -> dict[str, Any]:
    out = file.report.to_json()
    places = iter(file.located)
    for request in out.get("requests", [out]):
        for finding in request["findings"]:
            finding["location"] = _where(next(places))
    for group in out.get("groups", []):
        for finding in group["findings"]:
            finding["location"] = _where(next(places))
    return out


def _where(item: Located) -> dict[str, int | str]:
    return {"file": item.file, "line": item.line, "column": item.column,
            "end_line": item.end_line, "end_column": item.end_column}


def render_text(file: Linted) -> str:
    report, name = file.report, file.name
    places = iter(file.located)
    lines: list[str] = []
    singles = [report] if isinstance(report, LintReport) else list(report.reports)
    for index, single in enumerate(singles):
        if isinstance(report, LintReport) or single.findings:
            label = name if isinstance(report, LintReport) else f"{name} request {index}"
            _report_lines(single, label, places, lines)
    if isinstance(report, BatchReport):
        for group in report.groups:
            lines.append(f"group of {len(group.requests)} request(s) [{group.shape}]: "
                         f"{group.common_prefix_tokens} tokens in common, "
                         f"{group.cacheable_common_prefix_tokens} reusable from cache")
            for span in group.varying:
                examples = ", ".join(repr(_clip(e)) for e in span.examples)
                lines.append(f"  varies   {span.kind:<10} {span.path}:{span.start}-{span.end}"
                             f"  token {span.token_start}  {span.distinct} values: {examples}")
            for finding in group.findings:
                lines.extend(_finding_lines(finding, next(places)))
    warnings = report.warnings
    lines.append(f"{name}: {warnings} warning(s)" + (
        ": these break prefix caching" if warnings else ": nothing breaks prefix caching"))
    return "\n".join(lines)


def _report_lines(report: LintReport, name: str, places: Iterator[Located],
                  lines: list[str]) -> None:
    lines.append(f"{name}: {report.prompt_tokens} prompt tokens; cacheable prefix "
                 f"{report.cacheable_prefix_tokens} tokens, "
                 f"{report.cacheable_prefix_tokens_if_fixed} if fixed "
                 f"(KV block {report.block_size})")
    for finding in report.findings:
        lines.extend(_finding_lines(finding, next(places)))


def _finding_lines(finding: Finding, where: Located) -> list[str]:
    token = f"token {finding.token_start}" if finding.token_start is not None else "token ?"
    text = _clip(finding.text)
    head = (f"{where.file}:{where.line}:{where.column}: {finding.severity:<8} "
            f"{finding.kind:<16} {finding.path}:{finding.start}-{finding.end}  {token}  "
            f"{text!r}")
    body = finding.suggestion + (f" ({finding.detail})" if finding.detail else "")
    return [head] + textwrap.wrap(body, width=96, initial_indent=" " * 11,
                                  subsequent_indent=" " * 11)


def _clip(text: str, most: int = 60) -> str:
    """A span's text as the report shows it: at most ``most`` characters."""
    return text if len(text) <= most else text[:most - 1] + "…"
