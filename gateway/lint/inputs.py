"""What ``prefixgate lint`` reads: its file arguments, folders expanded, and the requests in each.

A FILE argument that is a folder stands for every prompt file under it
(``PROMPT_SUFFIXES``, recursively, in path order; hidden files and folders
left out). A file found that way that holds no chat request (a
``package.json``) is skipped, not an error; one named on the command line
must hold one.

A file holds one chat request, a list of them, ``{"requests": [...]}``, or
one per line (JSONL, each a request or a ``{"body": ...}`` /
``{"request": ...}`` record), as JSON or YAML. An Anthropic Messages API body
(top-level ``system``, content blocks) is read as the chat request vLLM renders
it (``gateway.lint.shapes``): its ``system`` is the system prompt; its findings
are put back on the body's own paths. What cannot be read is an
:class:`InputError` that says where: a JSON document cut short is reported
at the line and column where it breaks (not at line 1, where reading it as
JSONL would have stopped), a bad JSONL record at its own line. The messages
quote no content of the file, so they can go into a SARIF report.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from gateway.lint.locate import Source, json_source, yaml_source
from gateway.lint.shapes import ChatForm, chat_form, is_messages_api

PROMPT_SUFFIXES = (".json", ".jsonl", ".ndjson", ".yaml", ".yml")


class InputError(ValueError):
    """A file that is not chat requests; ``line``/``column`` (1-based) when known."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None,
                 no_request: bool = False) -> None:
        where = f"line {line}" + (f" column {column}" if column else "") + ": " if line else ""
        super().__init__(where + message)
        self.reason = message
        self.line = line
        self.column = column
        self.no_request = no_request
        """It parsed, and holds no chat request (skipped when found in a folder)."""


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    """The path as the user gave it, or as found under a folder they gave."""
    from_folder: bool = False
    empty_folder: bool = False
    """A folder given that holds no prompt file (an error: nothing was linted there)."""


def expand(arguments: Sequence[str]) -> Iterator[Target]:
    """The files to lint, folders expanded."""
    for argument in arguments:
        if argument != "-" and os.path.isdir(argument):
            found = False
            for name in _walk(argument):
                found = True
                yield Target(name, from_folder=True)
            if not found:
                yield Target(argument, empty_folder=True)
        else:
            yield Target(argument)


EMPTY_FOLDER = f"no prompt files ({', '.join(PROMPT_SUFFIXES)}) in this folder"


def _walk(folder: str) -> Iterator[str]:
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if not name.startswith(".") and name.lower().endswith(PROMPT_SUFFIXES):
                yield os.path.join(root, name)


@dataclass(frozen=True, slots=True)
class Requests:
    """A file's requests, where each sits in the file, and whether it held just one."""

    bodies: list[dict[str, Any]]
    prefixes: list[str]
    """Each request's JSON path in its ``Source`` (``[3]``, ``.requests[0]``, ``.body``)."""
    sources: list[Source]
    single: bool
    forms: list[ChatForm | None] = field(default_factory=list)
    """Each Messages API body's chat form (its chat request is in ``bodies``; the
    findings go back on its paths with ``shapes.in_body``); None for a chat request."""


def _as_chat(requests: Requests) -> Requests:
    forms = [chat_form(body) if is_messages_api(body) else None for body in requests.bodies]
    bodies = [body if form is None else form.chat
              for body, form in zip(requests.bodies, forms, strict=True)]
    return Requests(bodies, requests.prefixes, requests.sources, requests.single, forms)


def read_requests(text: str, name: str = "") -> Requests:
    """The requests in a file's text, with their places in it."""
    if name.lower().endswith((".yaml", ".yml")):
        try:
            data = yaml.safe_load(text)
            source = yaml_source(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            problem = getattr(exc, "problem", None) or "cannot be parsed"
            raise InputError(f"not YAML ({problem})", mark.line + 1 if mark else None,
                             mark.column + 1 if mark else None) from None
        return _as_chat(_document(data, source))
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data" or name.lower().endswith((".jsonl", ".ndjson")):
            return _as_chat(_lines(text))  # one document per line
        ended = not text[exc.pos:].strip()
        raise InputError(f"not JSON ({exc.msg}" + ("; the file ends before the JSON does)"
                                                   if ended else ")"),
                         exc.lineno, exc.colno) from None
    return _as_chat(_document(data, json_source(text)))


def _document(data: Any, source: Source) -> Requests:
    if isinstance(data, dict) and "messages" in data:
        return Requests([data], [""], [source], True)
    if isinstance(data, dict) and isinstance(data.get("requests"), list):
        items, base = data["requests"], ".requests"
    elif isinstance(data, list):
        items, base = data, ""
    else:
        raise InputError("no chat request found (no messages)", no_request=True)
    found = [_request(item, i) for i, item in enumerate(items)]
    return Requests([body for body, _ in found],
                    [f"{base}[{i}]{inner}" for i, (_, inner) in enumerate(found)],
                    [source] * len(found), False)


def _lines(text: str) -> Requests:
    bodies, prefixes, sources = [], [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            body, inner = _request(json.loads(line), number)
        except json.JSONDecodeError as exc:
            raise InputError(f"not JSON ({exc.msg})", number, exc.colno) from None
        bodies.append(body)
        prefixes.append(inner)
        sources.append(json_source(line, first_line=number))
    if not bodies:
        raise InputError("no chat request found", no_request=True)
    return Requests(bodies, prefixes, sources, False)


def _request(value: Any, where: int) -> tuple[dict[str, Any], str]:
    """A chat request and its path inside the item (``.body``, ``.request`` or none)."""
    if isinstance(value, dict):
        for key in ("body", "request"):
            if isinstance(value.get(key), dict) and "messages" in value[key]:
                return value[key], f".{key}"
        if isinstance(value.get("messages"), list):
            return value, ""
    raise InputError(f"item {where}: not a chat request (no messages)", no_request=True)
