"""MkDocs hook: lists written for CommonMark render the same in the site.

The pages (and the benchmark notes they link) are written as a code host
renders Markdown: a list may follow a paragraph line directly, and a nested
item is indented by two spaces. Python-Markdown, which MkDocs uses, wants a
blank line before a list and four spaces per level. So, outside fenced code,
this hook puts a blank line before a list that follows a paragraph and
doubles the indentation of the lines inside a list (nested items,
continuation lines, tables in an item). The sources stay as they are.
"""

from __future__ import annotations

import re
from typing import Any

ITEM = re.compile(r"^(?:[-*+]|\d+\.) ")
FENCE = re.compile(r"^\s*(```|~~~)")


def normalise(markdown: str) -> str:
    out: list[str] = []
    in_list = fenced = False
    offset = 0  # what a fence inside a list item was shifted by, for its content
    previous = ""
    for line in markdown.split("\n"):
        if FENCE.match(line):
            if not fenced:
                offset = _spaces(line) if in_list else 0
            fenced = not fenced
            line = " " * offset + line
        elif fenced:
            line = " " * offset + line if line.strip() else line
        elif ITEM.match(line):
            if previous.strip() and not in_list and not previous.startswith(("|", "#")):
                out.append("")
            in_list = True
        elif line.strip() and not line.startswith(" "):
            if not previous.strip():
                in_list = False  # a paragraph after a blank line ends the list
        elif in_list and line.startswith(" "):
            line = " " * _spaces(line) + line
        out.append(line)
        previous = line
    return "\n".join(out)


def _spaces(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def on_page_markdown(markdown: str, **_: Any) -> str:
    return normalise(markdown)
