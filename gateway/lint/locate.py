"""Where a finding is in the file it came from: JSON path + character offset -> line:column.

The linter places a finding by the request's JSON path and a character offset
in that string (``messages[0].content``, 52). A CI annotator wants
``prompts.json:14:31``. ``Source`` reads a file's values with their source
positions and answers ``locate(path, offset) -> (line, column)``, both
1-based, columns in characters (Unicode code points):

* JSON and JSONL: a small position-keeping scanner (``_JsonScanner``) walks
  the text once; a string's decoded characters map back through its escapes
  (``\\n``, ``\\u00e9``, a surrogate pair) to the raw characters, so the
  column is exact.
* YAML: PyYAML's node marks. Exact for a one-line scalar (plain or quoted
  without escapes) and for a literal block (``|``); a folded or multi-line
  flow scalar is placed at its first character.

A path that is not a value in the file (``chat_template``, ``messages`` for a
short prefix) is placed at the nearest enclosing value that is, at worst the
request itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

Mapper = Callable[[int], tuple[int, int]]
"""Character offset in a decoded string -> (line, column)."""

_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r",
            "t": "\t"}
_STEP = re.compile(r"\.([^.\[]+)|\[([0-9]+)\]")


@dataclass(slots=True)
class Source:
    """A file's values by JSON path (``[3].messages[0].content``), with their positions."""

    places: dict[str, Mapper] = field(default_factory=dict)

    def locate(self, path: str, offset: int = 0) -> tuple[int, int]:
        while True:
            mapper = self.places.get(path)
            if mapper is not None:
                return mapper(offset)
            if not path:
                return 1, 1
            path, offset = _parent(path), 0


def _parent(path: str) -> str:
    cut = max(path.rfind("."), path.rfind("["))
    return path[:max(cut, 0)]


def join(prefix: str, path: str) -> str:
    """A request-relative path under the request's own place in the file."""
    if not path:
        return prefix
    return prefix + (path if path.startswith("[") else "." + path)


# -- JSON ----------------------------------------------------------------------------------


def json_source(text: str, first_line: int = 1) -> Source:
    """Positions of every value of one JSON document; ``ValueError`` when it is not JSON."""
    source = Source()
    _JsonScanner(text, first_line, source.places).document()
    return source


class _JsonScanner:
    """One pass over a JSON text, iterative (any depth), recording where each value starts."""

    def __init__(self, text: str, first_line: int, places: dict[str, Mapper]) -> None:
        self.text = text
        self.places = places
        self.line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self.first_line = first_line

    def position(self, index: int) -> tuple[int, int]:
        line = _bisect(self.line_starts, index)
        return self.first_line + line, index - self.line_starts[line] + 1

    def document(self) -> None:
        text = self.text
        index = self._space(0)
        stack: list[tuple[str, str, int]] = []  # (container kind, path, next array index)
        path = ""
        while True:
            index = self._value(index, path, stack)
            while True:
                index = self._space(index)
                if not stack:
                    if index != len(text):
                        raise ValueError(f"extra data at character {index}")
                    return
                kind, parent, count = stack[-1]
                char = text[index:index + 1]
                if char == ",":
                    index = self._space(index + 1)
                    if kind == "[":
                        stack[-1] = (kind, parent, count + 1)
                        path = f"{parent}[{count + 1}]"
                    else:
                        key, index = self._key(index)
                        path = f"{parent}.{key}"
                    break
                if char == ("]" if kind == "[" else "}"):
                    stack.pop()
                    index += 1
                    continue
                raise ValueError(f"expected ',' at character {index}")

    def _value(self, index: int, path: str, stack: list[tuple[str, str, int]]) -> int:
        """Scan a value (or open a container, leaving it on ``stack``)."""
        text = self.text
        while True:
            char = text[index:index + 1]
            if char == '"':
                return self._string(index, path)
            self.places[path] = self._fixed(index)
            if char in "[{":
                closing = "]" if char == "[" else "}"
                index = self._space(index + 1)
                if text[index:index + 1] == closing:
                    return index + 1
                stack.append((char, path, 0))
                if char == "[":
                    path = f"{path}[0]"
                else:
                    key, index = self._key(index)
                    path = f"{path}.{key}"
                continue
            match = _NUMBER.match(text, index)
            if match:
                return match.end()
            for literal in ("true", "false", "null"):
                if text.startswith(literal, index):
                    return index + len(literal)
            raise ValueError(f"unexpected character at {index}")

    def _key(self, index: int) -> tuple[str, int]:
        if self.text[index:index + 1] != '"':
            raise ValueError(f"expected a key at character {index}")
        end = self._string_end(index)
        key = json.loads(self.text[index:end])
        index = self._space(end)
        if self.text[index:index + 1] != ":":
            raise ValueError(f"expected ':' at character {index}")
        return key, self._space(index + 1)

    def _string(self, index: int, path: str) -> int:
        end = self._string_end(index)
        raw = self.text[index + 1:end - 1]
        offsets = _decoded_offsets(raw) if "\\" in raw else None
        start = index + 1

        def mapper(offset: int) -> tuple[int, int]:
            if offsets is None:
                return self.position(start + offset)
            return self.position(start + offsets[min(offset, len(offsets) - 1)])
        self.places[path] = mapper
        return end

    def _string_end(self, index: int) -> int:
        text = self.text
        cursor = index + 1
        while True:
            stop = text.find('"', cursor)
            if stop < 0:
                raise ValueError(f"unterminated string at character {index}")
            backslashes = 0
            while text[stop - 1 - backslashes] == "\\":
                backslashes += 1
            if backslashes % 2 == 0:
                return stop + 1
            cursor = stop + 1

    def _fixed(self, index: int) -> Mapper:
        place = self.position(index)
        return lambda offset: place

    def _space(self, index: int) -> int:
        text = self.text
        while index < len(text) and text[index] in " \t\r\n":
            index += 1
        return index


def _decoded_offsets(raw: str) -> list[int]:
    """For each decoded character of a JSON string body, its offset in ``raw`` (+ one past
    the end)."""
    out: list[int] = []
    index = 0
    while index < len(raw):
        out.append(index)
        if raw[index] != "\\":
            index += 1
            continue
        if raw[index + 1:index + 2] in _ESCAPES:
            index += 2
            continue
        code = int(raw[index + 2:index + 6], 16)
        index += 6
        if 0xD800 <= code < 0xDC00 and raw[index:index + 2] == "\\u":
            index += 6  # a surrogate pair is one character
    out.append(len(raw))
    return out


def _bisect(starts: list[int], index: int) -> int:
    low, high = 0, len(starts)
    while high - low > 1:
        middle = (low + high) // 2
        if starts[middle] <= index:
            low = middle
        else:
            high = middle
    return low


# -- YAML ----------------------------------------------------------------------------------


def yaml_source(text: str) -> Source:
    """Positions of every value of a YAML document (``yaml.YAMLError`` when invalid)."""
    source = Source()
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    stack: list[tuple[Any, str]] = [(root, "")] if root is not None else []
    lines = text.split("\n")
    while stack:
        node, path = stack.pop()
        source.places[path] = _yaml_mapper(node, lines)
        if isinstance(node, yaml.MappingNode):
            stack.extend((value, f"{path}.{key.value}") for key, value in node.value)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, f"{path}[{i}]") for i, item in enumerate(node.value))
    return source


def _yaml_mapper(node: Any, lines: list[str]) -> Mapper:
    line, column = node.start_mark.line + 1, node.start_mark.column + 1
    style = getattr(node, "style", None)
    if isinstance(node, yaml.ScalarNode) and style == "|":
        body = node.value.split("\n")
        first = line  # the "|" indicator's line; the text starts on the next one
        indent = len(lines[first]) - len(lines[first].lstrip(" ")) if first < len(lines) else 0

        def block(offset: int) -> tuple[int, int]:
            for number, piece in enumerate(body):
                if offset <= len(piece):
                    return first + 1 + number, indent + offset + 1
                offset -= len(piece) + 1
            return first + len(body), indent + 1
        return block
    single_line = node.end_mark.line == node.start_mark.line
    if isinstance(node, yaml.ScalarNode) and single_line and style in (None, "'", '"'):
        skip = 0 if style is None else 1
        raw = lines[node.start_mark.line][node.start_mark.column + skip:]
        if not raw.startswith(node.value):
            return lambda offset: (line, column)  # escapes: the scalar's start
        return lambda offset: (line, column + skip + offset)
    return lambda offset: (line, column)
