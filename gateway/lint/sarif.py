"""SARIF 2.1.0 for ``prefixgate lint --format sarif``: code-scanning tools read findings.

One run, one rule per finding kind (its fix as the help text), one result per
finding placed at ``file:line:column`` (``Located``). ``warning`` findings are
SARIF ``warning``, ``info`` ones ``note``. Columns count Unicode code points
(``columnKind: unicodeCodePoints``), as the locator does. The message names
the kind and the fix; the prompt text itself is only referred to by its
region, so an uploaded report carries no prompt text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

from .model import Finding
from .suggest import SUGGESTIONS

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


def sarif_log(located: Sequence[Located], version: str) -> dict[str, Any]:
    kinds = sorted({item.finding.kind for item in located})
    rules = [{"id": kind, "name": kind,
              "shortDescription": {"text": f"{kind} breaks prefix caching"},
              "help": {"text": SUGGESTIONS.get(kind, SUGGESTIONS["text"])},
              "defaultConfiguration": {"level": "warning"}} for kind in kinds]
    index = {kind: i for i, kind in enumerate(kinds)}
    results = [_result(item, index[item.finding.kind]) for item in located]
    return {"$schema": SCHEMA, "version": "2.1.0", "runs": [{
        "tool": {"driver": {"name": "prefixgate lint", "version": version, "rules": rules}},
        "columnKind": "unicodeCodePoints",
        "results": results}]}


def _uri(file: str) -> str:
    """A relative path as given (relative to the repository, as pre-commit passes it), an
    absolute one as a ``file:`` URI."""
    path = PurePath(file)
    return Path(file).as_uri() if path.is_absolute() else path.as_posix()


def _result(item: Located, rule_index: int) -> dict[str, Any]:
    finding = item.finding
    message = f"{finding.kind} at {finding.path}: {finding.suggestion}"
    if finding.detail:
        message += f" ({finding.detail})"
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
