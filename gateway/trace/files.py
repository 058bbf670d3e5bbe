"""A trace file as :class:`TraceLine` records, whatever its wrapping and which public format.

Wrapping: a gzip'd file (told by its first bytes, not its name) is read through
``gzip``; a UTF-8 byte order mark is dropped; CRLF line ends and blank lines are
fine. Lines are read one at a time, so a file's size costs only its records.

Formats, told by the first line that is not blank:

* JSON Lines (``{`` first): the gateway's own trace, a Mooncake trace, an Alibaba
  Bailian usage trace (``gateway.trace.format.parse_line``);
* CSV with a header: the Azure LLM inference traces (``TIMESTAMP,ContextTokens,
  GeneratedTokens``; a date and time, taken as UTC) and BurstGPT
  (``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``; seconds
  from the trace's start). Neither says which prompts shared a prefix, so their
  records have no hash ids: each prompt is its own, and a replay of them is a floor
  on the hit rate, and a question of load alone;
* anything else is refused by name: a JSON document (a ShareGPT file: conversations,
  with no arrival times or token counts), a CSV with other columns.

Every error names the file and the line, and says what the reader expected.
"""

from __future__ import annotations

import csv
import datetime as dt
import gzip
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from gateway.trace.format import MOONCAKE_BLOCK_TOKENS, TraceFormatError, TraceLine, parse_line

log = logging.getLogger("prefixgate.trace")

GZIP_MAGIC = b"\x1f\x8b"
BOM = b"\xef\xbb\xbf"
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens")
FORMATS = ("JSON Lines (the gateway's trace, Mooncake, Alibaba Bailian), or a CSV of the "
           "Azure LLM inference trace (TIMESTAMP,ContextTokens,GeneratedTokens) or of "
           "BurstGPT (Timestamp,Model,Request tokens,Response tokens,...)")


def _open(path: Path) -> BinaryIO:
    handle: BinaryIO = path.open("rb")
    if handle.read(2) == GZIP_MAGIC:
        handle.close()
        return gzip.open(path, "rb")  # type: ignore[return-value]
    handle.seek(0)
    return handle


def _lines(handle: BinaryIO) -> Iterator[tuple[int, bytes]]:
    """(1-based number, line) for every line, the byte order mark dropped."""
    for number, line in enumerate(handle, 1):
        if number == 1 and line.startswith(BOM):
            line = line[len(BOM):]
        yield number, line


def read_trace(path: str | Path) -> Iterator[TraceLine]:
    """The records of one trace file, in file order (module docstring)."""
    path = Path(path)
    try:
        with _open(path) as handle:
            lines = _lines(handle)
            for number, first in lines:
                if first.strip():
                    break
            else:
                return
            head = first.lstrip()
            if head.startswith(b"{"):
                yield from _jsonl(_chain(number, first, lines))
            elif head.startswith(b"["):
                raise TraceFormatError(
                    f"trace line {number}: a JSON document, not a trace of one request a line. A "
                    "conversation dataset such as ShareGPT has no arrival times or token "
                    "counts to replay; the trace formats read are " + FORMATS)
            else:  # the header read, the rows are what is left
                yield from _csv_reader(first, number, path)(lines)
    except TraceFormatError as exc:
        raise TraceFormatError(f"{path}: {exc}") from None
    except (OSError, EOFError, UnicodeDecodeError) as exc:  # a truncated gzip, a bad byte
        raise TraceFormatError(f"{path}: cannot be read: {exc}") from None


def _chain(number: int, first: bytes,
           rest: Iterator[tuple[int, bytes]]) -> Iterator[tuple[int, bytes]]:
    yield number, first
    yield from rest


def _jsonl(lines: Iterator[tuple[int, bytes]]) -> Iterator[TraceLine]:
    for number, text in lines:
        line = parse_line(text, number)
        if line is not None:
            yield line


def _csv_reader(header_line: bytes, number: int, path: Path
                ) -> Callable[[Iterator[tuple[int, bytes]]], Iterator[TraceLine]]:
    header = [name.strip() for name in next(csv.reader([_text(header_line, number)]))]
    # by the columns' names, wherever they stand: BurstGPT's later releases put "Session
    # ID" and "Elapsed time" among them
    if set(AZURE_COLUMNS) <= set(header):
        convert = _azure_row
    elif set(BURSTGPT_COLUMNS) <= set(header):
        convert = _burstgpt_row
    else:
        shown = ",".join(header)[:120]
        raise TraceFormatError(f"trace line {number}: neither a JSON object nor a known CSV header "
                               f"({shown!r}); the trace formats read are " + FORMATS)

    def rows(lines: Iterator[tuple[int, bytes]]) -> Iterator[TraceLine]:
        failed = 0
        for at, text in lines:
            if not text.strip():
                continue
            row = next(csv.reader([_text(text, at)]))
            if len(row) < len(header):
                raise TraceFormatError(f"trace line {at}: {len(row)} columns where the "
                                       f"header has {len(header)}")
            try:
                line = convert(dict(zip(header, (cell.strip() for cell in row), strict=False)))
            except (KeyError, ValueError) as exc:
                raise TraceFormatError(f"trace line {at}: {exc}") from None
            if line.input_length == 0 and line.output_length == 0:
                failed += 1  # BurstGPT's failed requests: "0,0,0"
                continue
            if line.input_length <= 0 or line.output_length < 0:
                raise TraceFormatError(f"trace line {at}: the prompt must have tokens and "
                                       "the answer none or more")
            yield line
        if failed:
            log.warning("%s: %s row(s) with no tokens at all left out (failed requests, as "
                        "BurstGPT's files hold them)", path, f"{failed:,}")
    return rows


def _text(line: bytes, number: int) -> str:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError:
        raise TraceFormatError(f"trace line {number}: not UTF-8 text") from None


def _azure_row(row: dict[str, str]) -> TraceLine:
    """``2023-11-16 18:15:46.6805900,4808,10``: arrival (UTC), prompt and answer tokens."""
    stamp = row["TIMESTAMP"]
    try:
        when = dt.datetime.fromisoformat(stamp)
    except ValueError:
        raise ValueError(f"TIMESTAMP {stamp!r} is not a date and time") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return TraceLine(timestamp_ms=round(when.timestamp() * 1000),
                     input_length=int(row["ContextTokens"]),
                     output_length=int(row["GeneratedTokens"]), hash_ids=(),
                     block_size=MOONCAKE_BLOCK_TOKENS)


def _burstgpt_row(row: dict[str, str]) -> TraceLine:
    """``5,ChatGPT,472,18,490,Conversation log``: seconds from the start, the model, the
    request's and the response's tokens."""
    return TraceLine(timestamp_ms=round(float(row["Timestamp"]) * 1000),
                     input_length=int(row["Request tokens"]),
                     output_length=int(row["Response tokens"]), hash_ids=(),
                     block_size=MOONCAKE_BLOCK_TOKENS, model=row["Model"] or None)

