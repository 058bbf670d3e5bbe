"""A client's ``x-request-id``, made safe to log, forward and echo.

The gateway logs a request's id (the access log), forwards it to the
replica (vLLM logs it and echoes it in its answer) and echoes it to the
client. A client's value is taken as the id, but not verbatim:

* every byte outside visible ASCII (``!`` to ``~``) is percent-encoded, and
  so is ``%`` itself: control characters, DEL, and the UTF-8 of non-ASCII
  text, so C1 controls and the line separators U+0085, U+2028 and U+2029 never
  reach a log line raw (a log reader splitting on them would see a forged
  line); the id stays printable and the original bytes recoverable;
* the result is cut to ``MAX_REQUEST_ID`` bytes (never inside a ``%XX``), so
  a 60 KB id does not ride along on every log line and upstream request.

The server applies it to the header as the request is parsed
(``gateway.server.http``), so the log, the replica and the echo all see the same
value. An id that is visible ASCII within the bound is unchanged.
"""

from __future__ import annotations

import re

MAX_REQUEST_ID = 128
"""Bytes of an id kept (a UUID is 36, a W3C traceparent 55)."""

_UNSAFE = re.compile(rb"[^!-$&-~]")
"""Bytes that are not visible ASCII, and ``%``."""


def _escape(match: re.Match[bytes]) -> bytes:
    return b"%%%02X" % match.group()[0]


def clean_request_id(raw: bytes) -> bytes:
    """``raw`` percent-encoded where unsafe and cut to ``MAX_REQUEST_ID`` bytes."""
    if len(raw) <= MAX_REQUEST_ID and not _UNSAFE.search(raw):
        return raw
    escaped = _UNSAFE.sub(_escape, raw[:MAX_REQUEST_ID])[:MAX_REQUEST_ID]
    cut = escaped.rfind(b"%", len(escaped) - 2)
    return escaped[:cut] if cut >= 0 else escaped
