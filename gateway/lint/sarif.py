"""SARIF 2.1.0 for ``prefixgate lint --format sarif``: code-scanning tools read findings.

One run, one rule per finding kind (its fix as the help text), one result per
finding placed at ``file:line:column`` (``Located``). ``warning`` findings are
SARIF ``warning``, ``info`` ones ``note``. Columns count Unicode code points
(``columnKind: unicodeCodePoints``), as the locator does. The message names
the kind, the JSON path and the fix; the prompt text itself is only referred
to by its region, so an uploaded report carries no prompt text. The
finding's detail (the timestamp as read, a tool's name: taken from the
prompt) and its text are added only when asked (``prompt_text``).

The run's one invocation says whether every file was linted
(``executionSuccessful``); each file that was not is a
``toolExecutionNotifications`` entry (``error``, or ``note`` for a file
skipped because it holds no chat request) at its file and, when known, the
line and column where it breaks, so a code-scanning upload of a broken file
does not look clean; what the run could not check (names without the
``names`` extra, tokens without a tokenizer) is a ``note`` notification.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

from gateway.lint.model import Finding
from gateway.lint.suggest import SUGGESTIONS

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


@dataclass(frozen=True, slots=True)
class Located:
    """A finding and where it is in its file (1-based line and column)."""

    file: str
    finding: Finding
    line: int
    column: int
    end_line: int
    end_column: int


@dataclass(frozen=True, slots=True)
class Unlinted:
    """A file that was not linted, and why (a message that quotes none of its content)."""

    file: str
    message: str
    line: int | None = None
    column: int | None = None
    skipped: bool = False
    """Found in a folder, and not chat requests: a note, not an error."""


def sarif_log(located: Sequence[Located], version: str, unlinted: Sequence[Unlinted] = (),
              prompt_text: bool = False, notes: Sequence[str] = ()) -> dict[str, Any]:
    """``notes``: what the run did not check (a missing extra), ``note`` notifications."""
    kinds = sorted({item.finding.kind for item in located})
    rules = [{"id": kind, "name": kind,
              "shortDescription": {"text": f"{kind} breaks prefix caching"},
              "help": {"text": SUGGESTIONS.get(kind, SUGGESTIONS["text"])},
              "defaultConfiguration": {"level": "warning"}} for kind in kinds]
    index = {kind: i for i, kind in enumerate(kinds)}
    results = [_result(item, index[item.finding.kind], prompt_text) for item in located]
    invocation = {"executionSuccessful": not any(not item.skipped for item in unlinted),
                  "toolExecutionNotifications": [_notification(item) for item in unlinted]
                  + [{"level": "note", "message": {"text": note}} for note in notes]}
    return {"$schema": SCHEMA, "version": "2.1.0", "runs": [{
        "tool": {"driver": {"name": "prefixgate lint", "version": version, "rules": rules}},
        "invocations": [invocation],
        "columnKind": "unicodeCodePoints",
        "results": results}]}


def _notification(item: Unlinted) -> dict[str, Any]:
    location: dict[str, Any] = {"artifactLocation": {"uri": _uri(item.file)}}
    if item.line is not None:
        location["region"] = {"startLine": item.line,
                              **({"startColumn": item.column} if item.column else {})}
    return {"level": "note" if item.skipped else "error",
            "message": {"text": f"{item.file}: {item.message}"},
            "locations": [{"physicalLocation": location}]}


def _uri(file: str) -> str:
    """A relative path as given (relative to the repository, as pre-commit passes it), an
    absolute one as a ``file:`` URI."""
    path = PurePath(file)
    return Path(file).as_uri() if path.is_absolute() else path.as_posix()


def _result(item: Located, rule_index: int, prompt_text: bool) -> dict[str, Any]:
    finding = item.finding
    message = f"{finding.kind} at {finding.path}: {finding.suggestion}"
    if prompt_text and finding.detail:
        message += f" ({finding.detail})"
    if prompt_text and finding.text:
        message += f" Found: {finding.text!r}."
    return {
        "ruleId": finding.kind, "ruleIndex": rule_index,
        "level": "warning" if finding.severity == "warning" else "note",
        "message": {"text": message},
        "locations": [{"physicalLocation": {
            "artifactLocation": {"uri": _uri(item.file)},
            "region": {"startLine": item.line, "startColumn": item.column,
                       "endLine": item.end_line, "endColumn": item.end_column}}}],
        "properties": {"path": finding.path, "tokenStart": finding.token_start,
                       "confidence": round(finding.confidence, 2)}}
