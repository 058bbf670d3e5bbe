"""A relayed event stream goes out whole events at a time (``EventEdge``), so an error
event the gateway adds after a replica dies mid-event is read as one."""

from __future__ import annotations

import json
import random

import pytest

from gateway.request.streaming import EventEdge, error_event

EVENTS = [b'data: {"choices": [{"delta": {"content": "t%d"}}]}\n\n' % i for i in range(6)]


@pytest.mark.parametrize("seed", range(20))
def test_any_cut_into_chunks_goes_out_as_whole_events(seed: int) -> None:
    stream = b"".join(EVENTS)
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(stream)), 8))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    edge = EventEdge()
    out = [edge.take(chunk) for chunk in chunks]
    out.append(edge.rest())
    assert b"".join(out) == stream  # nothing lost, nothing reordered
    for piece in out:
        assert piece == b"" or piece.endswith(b"\n\n")


def test_a_stream_cut_mid_event_then_an_error_reads_as_events() -> None:
    """What the client reads when the replica dies in the middle of its third event."""
    edge = EventEdge()
    sent = edge.take(EVENTS[0] + EVENTS[1] + EVENTS[2][:20])
    sent += error_event(502, "the replica failed mid-stream", "BadGatewayError",
                        "upstream_stream_broken")
    events = [json.loads(e[len(b"data: "):]) for e in sent.split(b"\n\n") if e]
    assert [e.get("choices", [{}])[0].get("delta") for e in events[:2]] == [
        {"content": "t0"}, {"content": "t1"}]
    assert events[2]["error"]["code"] == "upstream_stream_broken"


def test_events_ended_by_crlf_pass_and_a_chunk_without_an_end_waits() -> None:
    edge = EventEdge()
    assert edge.take(b"event: a\r\ndata: 1\r\n\r\n") == b"event: a\r\ndata: 1\r\n\r\n"
    assert edge.take(b"data: 2") == b""
    assert edge.take(b"\r\n\r\ndata: 3") == b"data: 2\r\n\r\n"
    assert edge.rest() == b"data: 3"


def test_a_body_that_is_not_events_is_not_held_back_without_bound() -> None:
    edge = EventEdge()
    blob = b"x" * (EventEdge.LIMIT + 1)
    assert edge.take(blob) == blob
    assert edge.rest() == b""
