"""A ``multipart/form-data`` body read in place: its parts, and its small text fields.

vLLM's audio routes (``/v1/audio/transcriptions``, ``/translations``) take a
form: the audio ``file`` and fields such as ``model``, ``language`` and
``stream``. The gateway forwards the body's bytes unchanged and only reads
the text fields it routes on; the simulator reads the same form. Parts are
found by their boundary and never copied (a file part is only measured). A
body that is not a well-formed form has no parts.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

_BOUNDARY = re.compile(r'boundary=(?:"([^"]+)"|([^;\s]+))', re.IGNORECASE)
_NAME = re.compile(rb'\bname="([^"]*)"', re.IGNORECASE)
_FILENAME = re.compile(rb'\bfilename="([^"]*)"', re.IGNORECASE)
FIELD_LIMIT = 4096
"""Text fields longer than this are not read as routing fields."""


@dataclass(frozen=True, slots=True)
class Part:
    name: str
    filename: str | None
    start: int
    """Where the part's content begins in the body."""
    end: int
    """Where it ends (exclusive; the line break before the next boundary excluded)."""

    @property
    def size(self) -> int:
        return self.end - self.start


def boundary(content_type: str) -> str | None:
    if not content_type.lower().startswith("multipart/form-data"):
        return None
    match = _BOUNDARY.search(content_type)
    return (match.group(1) or match.group(2)) if match else None


def parts(body: bytes, content_type: str) -> Iterator[Part]:
    """The form's parts, in order (none when ``content_type`` is not a form's)."""
    marker = boundary(content_type)
    if marker is None:
        return
    delimiter = b"--" + marker.encode("latin-1")
    start = body.find(delimiter)
    while start != -1:
        part_start = start + len(delimiter)
        end = body.find(delimiter, part_start)
        if end == -1:
            return
        head_end = body.find(b"\r\n\r\n", part_start, end)
        name = _NAME.search(body, part_start, head_end) if head_end != -1 else None
        if name is not None:
            filename = _FILENAME.search(body, part_start, head_end)
            content_end = end - 2 if body[end - 2:end] == b"\r\n" else end
            yield Part(name.group(1).decode("utf-8", "replace"),
                       filename.group(1).decode("utf-8", "replace") if filename else None,
                       head_end + 4, max(content_end, head_end + 4))
        start = end


def form_fields(body: bytes, content_type: str, wanted: tuple[str, ...]) -> dict[str, str]:
    """The ``wanted`` text fields of a form (the first of each; file parts ignored)."""
    found: dict[str, str] = {}
    for part in parts(body, content_type):
        if (part.filename is None and part.name in wanted and part.name not in found
                and part.size <= FIELD_LIMIT):
            found[part.name] = body[part.start:part.end].decode("utf-8", "replace")
    return found
