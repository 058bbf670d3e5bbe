"""Frames on the hub's socket, read as they come: split across reads, or several in one."""

from __future__ import annotations

import asyncio
import struct

import pytest

from gateway.fleet.codec import BadPayload
from gateway.fleet.local import MAX_FRAME, frame, read_frames


async def frames_of(*chunks: bytes) -> tuple[list[tuple[bytes, bytes]], BaseException]:
    reader = asyncio.StreamReader()
    for chunk in chunks:
        reader.feed_data(chunk)
    reader.feed_eof()
    got: list[tuple[bytes, bytes]] = []
    with pytest.raises((asyncio.IncompleteReadError, BadPayload)) as ended:
        async for item in read_frames(reader):
            got.append(item)
    return got, ended.value


async def test_frames_split_across_reads_and_packed_into_one_come_whole_and_in_order() -> None:
    wire = frame(b"B", b"first") + frame(b"K", b"") + frame(b"A", bytes(range(256)) * 40)
    expected = [(b"B", b"first"), (b"K", b""), (b"A", bytes(range(256)) * 40)]
    assert (await frames_of(wire))[0] == expected  # one read
    pieces = [wire[i:i + 3] for i in range(0, len(wire), 3)]  # a header split, too
    got, ended = await frames_of(*pieces)
    assert got == expected
    assert isinstance(ended, asyncio.IncompleteReadError) and ended.partial == b""


async def test_a_connection_that_ends_mid_frame_ends_the_reading() -> None:
    wire = frame(b"B", b"whole") + frame(b"B", b"cut short")
    got, ended = await frames_of(wire[:-3])
    assert got == [(b"B", b"whole")]
    assert isinstance(ended, asyncio.IncompleteReadError)


async def test_a_frame_larger_than_the_limit_is_refused_before_it_is_read() -> None:
    got, ended = await frames_of(struct.pack(">cI", b"B", MAX_FRAME + 1) + b"x")
    assert got == [] and isinstance(ended, BadPayload)
