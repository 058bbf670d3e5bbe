"""A poured stream's per-chunk work, compiled (``gateway._relay``) and in Python, does the
same: the client gets the same bytes, the same pauses, and the usage the gateway
records (events, bytes, the usage chunk at the end) is what feeding every chunk to
the observer gave."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import gateway._relay as compiled  # `make setup` builds it; a collection error says it did not
import pytest

from gateway.request import streaming
from gateway.request.streaming import EventEdge, PyEventTap
from gateway.request.usage import TAIL_BYTES, StreamObserver
from gateway.server.http import CycleBodyWriter


def test_the_gateway_uses_the_compiled_one() -> None:
    assert streaming.EventTap is compiled.EventTap
    assert isinstance(CycleBodyWriter(Cycle()).write, compiled.ChunkedWriter)  # type: ignore[arg-type]
    assert compiled.TAIL_BYTES == TAIL_BYTES


class Transport:
    def __init__(self) -> None:
        self.out: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.out.append(data)


@dataclass
class Flow:
    write_paused: bool = False


@dataclass
class Cycle:
    transport: Transport = field(default_factory=Transport)
    flow: Flow = field(default_factory=Flow)
    disconnected: bool = False


def _events(rng: random.Random, count: int) -> bytes:
    ends = [b"\n\n", b"\r\n\r\n", b"\r\r"]
    parts = []
    for i in range(count):
        text = "x" * rng.randrange(0, 400)
        parts.append(b'data: {"choices": [{"delta": {"content": "%d %s"}}]}' % (i, text.encode())
                     + rng.choice(ends))
    parts.append(b'\n\ndata: {"choices": [], "usage": {"prompt_tokens": 7, '
                 b'"completion_tokens": %d}}\n\ndata: [DONE]\n\n' % count)
    return b"".join(parts)


def _chunks(rng: random.Random, stream: bytes) -> list[bytes]:
    """The stream cut anywhere, "data: " split across chunks included, and empty chunks."""
    cuts = sorted(rng.sample(range(1, len(stream)), min(len(stream) - 1, rng.randrange(1, 120))))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    for _ in range(rng.randrange(0, 4)):
        chunks.insert(rng.randrange(len(chunks) + 1), b"")
    return chunks


def _relay(tap_class: type, chunks: list[bytes], events: bool,
           pauses: set[int]) -> tuple[list[bytes], list[bool], StreamObserver]:
    """The proxy's relay: the first chunk fed to the observer, the rest through a tap
    writing to a client connection, the tap merged in at the end."""
    cycle = Cycle()
    writer = CycleBodyWriter(cycle)  # type: ignore[arg-type]
    write = writer.write if tap_class is not PyEventTap else writer._write
    observer = StreamObserver()
    observer.feed(chunks[0])
    edge = EventEdge() if events else None
    tap = tap_class(edge, write)
    answers = []
    for i, chunk in enumerate(chunks[1:]):
        cycle.flow.write_paused = i in pauses
        answers.append(tap(chunk))
    observer.merge(tap.events, tap.size, tap.tail())
    return cycle.transport.out, answers, observer


@pytest.mark.parametrize("seed", range(40))
def test_compiled_and_python_taps_relay_and_count_alike(seed: int) -> None:
    rng = random.Random(seed)
    stream = _events(rng, rng.randrange(1, 200))
    chunks = _chunks(rng, stream)
    events = seed % 4 != 3
    pauses = set(rng.sample(range(len(chunks)), min(len(chunks), 3)))
    fast = _relay(compiled.EventTap, chunks, events, pauses)
    slow = _relay(PyEventTap, chunks, events, pauses)
    assert fast[0] == slow[0]  # the same frames on the client's connection
    assert fast[1] == slow[1]  # the same pauses asked for
    # A pause is asked for only after a write (a chunk held for its event's end writes
    # nothing), and after every write while the client's buffer is full.
    assert {i for i, ok in enumerate(fast[1]) if not ok} <= pauses

    # What the gateway records: as if every chunk had been fed to the observer.
    fed = StreamObserver()
    for chunk in chunks:
        fed.feed(chunk)
    for observer in (fast[2], slow[2]):
        assert (observer.events, observer.bytes) == (fed.events, fed.bytes)
        assert observer.tail() == fed.tail()
        assert observer.usage() == fed.usage()
    assert fed.usage() is not None and fed.usage().prompt_tokens == 7  # type: ignore[union-attr]


def _unframed(frames: list[bytes]) -> bytes:
    body = b""
    for frame in frames:
        size, _, rest = frame.partition(b"\r\n")
        assert rest.endswith(b"\r\n") and len(rest) == int(size, 16) + 2
        body += rest[:-2]
    return body


def test_an_event_stream_goes_out_whole_events_at_a_time() -> None:
    stream = _events(random.Random(1), 30)
    chunks = _chunks(random.Random(2), stream)
    frames, _, _ = _relay(compiled.EventTap, chunks, True, set())
    body = chunks[0] + _unframed(frames)
    assert body.startswith(chunks[0]) and stream.startswith(body)
    for frame in frames:
        assert frame.endswith((b"\n\n\r\n", b"\r\n\r\n\r\n", b"\r\r\r\n"))  # each frame ends an event


def test_the_tail_keeps_only_the_last_16_kib() -> None:
    tap = compiled.EventTap(None, lambda chunk: True)
    for i in range(2000):
        tap(b"data: %d\n\n" % i + b"x" * 90)
    kept = tap.tail()
    assert sum(map(len, kept)) - len(kept[0]) < TAIL_BYTES <= sum(map(len, kept))
    assert kept[-1].startswith(b"data: 1999") and tap.events == 2000


@pytest.mark.parametrize("make", [lambda c: compiled.ChunkedWriter(c),
                                  lambda c: CycleBodyWriter(c)._write])
def test_the_writer_frames_skips_a_gone_client_and_reports_pauses(make: object) -> None:
    cycle = Cycle()
    write = make(cycle)  # type: ignore[operator]
    assert write(b"hello") is True
    assert write(b"") is True  # nothing written: an empty chunk would end the body
    cycle.flow.write_paused = True
    assert write(b"x" * 300) is False
    cycle.disconnected = True
    assert write(b"lost") is False
    assert cycle.transport.out == [b"5\r\nhello\r\n", b"12c\r\n" + b"x" * 300 + b"\r\n"]


def test_a_failing_write_and_a_bad_chunk_raise() -> None:
    def broken(chunk: bytes) -> bool:
        raise ConnectionResetError("gone")

    tap = compiled.EventTap(EventEdge(), broken)
    with pytest.raises(ConnectionResetError):
        tap(b"data: 1\n\n")
    with pytest.raises(TypeError):
        tap("data: 1\n\n")
    with pytest.raises(TypeError):
        compiled.ChunkedWriter(Cycle())(bytearray(b"x"))


def test_a_json_answer_whose_first_chunk_is_blank_still_gives_its_usage() -> None:
    """vLLM answers a batch of chats with one JSON body whatever ``stream`` says."""
    body = b'{"id": "x", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}'
    observer = StreamObserver()
    observer.feed(b"\n")
    tap = compiled.EventTap(None, lambda chunk: True)
    tap(body[:30])
    tap(body[30:])
    observer.merge(tap.events, tap.size, tap.tail())
    usage = observer.usage()
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (5, 2)
