"""The wire format of shared routing state, and the journal that becomes its snapshot."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.fleet.codec import (
    BadPayload,
    Load,
    Routed,
    Run,
    Snapshot,
    decode_batch,
    decode_snapshot,
    encode_batch,
    encode_snapshot,
)
from gateway.fleet.journal import Journal
from gateway.fleet.sync import redact_url
from policies.prefix_index import ApproximatePrefixIndex

hashes = st.lists(st.integers(0, 2**64 - 1), max_size=50).map(tuple)


@given(st.lists(st.tuples(st.sampled_from(["r0", "r1"]), hashes,
                          st.none() | st.text(max_size=8)), max_size=10))
def test_batches_round_trip(routed: list[tuple[str, tuple[int, ...], str | None]]) -> None:
    entries = [Routed(*item) for item in routed] + [Load({"r0": 3, "r1": 0})]
    batch = decode_batch(encode_batch("gw-a", entries))
    assert batch.instance == "gw-a"
    assert list(batch.entries) == entries


def test_negative_hashes_travel_as_their_unsigned_value() -> None:
    (entry,) = decode_batch(encode_batch("a", [Routed("r0", (-1,))])).entries
    assert isinstance(entry, Routed) and entry.block_hashes == (2**64 - 1,)


@pytest.mark.parametrize("payload", [
    b"", b"\xc1", msgpack.packb([2, "a", []]), msgpack.packb([1, "a", [[9, "x"]]]),
    msgpack.packb([1, "a", [[0, "r0", b"123", None]]]),  # hashes not a multiple of 8 bytes
    msgpack.packb([1, "a", [[1, {"r0": "many"}]]]), msgpack.packb({"v": 1}),
])
def test_what_does_not_decode_is_refused(payload: bytes) -> None:
    with pytest.raises(BadPayload):
        decode_batch(payload)


def test_snapshots_round_trip_and_refuse_garbage() -> None:
    snapshot = Snapshot("17-3", 1234.5, {"r0": [Run(2.0, (1, 2)), Run(0.5, (1,))]},
                        [("user-7", "r0", 1.5)])
    assert decode_snapshot(encode_snapshot(snapshot)) == snapshot
    for garbage in (b"x", msgpack.packb({"v": 2}), msgpack.packb({"v": 1, "id": "1-0"})):
        with pytest.raises(BadPayload):
            decode_snapshot(garbage)


def test_the_journal_replayed_rebuilds_the_same_index() -> None:
    """A newcomer applying the snapshot's runs, oldest first, matches prompts as the
    instance that learned them does, including what the LRU already evicted."""
    learned = ApproximatePrefixIndex(default_capacity_blocks=6)
    journal = Journal(blocks_per_replica=6)
    prompts = [("r0", (1, 2, 3)), ("r1", (1, 2, 9)), ("r0", (1, 2, 4, 5)), ("r0", (7, 8))]
    for now, (replica, blocks) in enumerate(prompts, start=1):
        learned.record(replica, blocks, float(now))
        journal.routed(replica, blocks, None, float(now))
    snapshot = decode_snapshot(encode_snapshot(journal.snapshot("5-0", 10.0, 0.0)))
    rebuilt = ApproximatePrefixIndex(default_capacity_blocks=6)
    for replica, runs in snapshot.replicas.items():
        for run in runs:
            rebuilt.record(replica, run.block_hashes, 10.0 - run.age)
    for probe in [(1, 2, 3), (1, 2, 9), (1, 2, 4, 5), (7, 8), (1, 2, 4, 6)]:
        assert rebuilt.match(probe, 10.0) == learned.match(probe, 10.0), probe
    assert learned.match((1, 2, 3), 10.0) == {"r0": 2, "r1": 2}  # block 3 was evicted


def test_the_journal_is_bounded_and_ages_out() -> None:
    journal = Journal(blocks_per_replica=3, max_sessions=2, max_age_seconds=10.0)
    journal.routed("r0", (1, 2, 3, 4, 5), "a", 0.0)
    journal.routed("r0", (6,), "b", 8.0)
    journal.routed("r1", (7,), "c", 9.0)
    assert journal.size("r0") == 3
    snapshot = journal.snapshot("1-0", 12.0, 100.0)
    assert [run.block_hashes for run in snapshot.replicas["r0"]] == [(6,)]  # (1, 2) too old
    assert [(key, replica) for key, replica, _ in snapshot.sessions] == [("b", "r0"), ("c", "r1")]
    journal.forget_replica("r1")
    assert "r1" not in journal.snapshot("1-0", 12.0, 100.0).replicas


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://:s3cret@cache:6379/0", "redis://:***@cache:6379/0"),
    ("rediss://app:s3cret@cache.example:6380", "rediss://app:***@cache.example:6380"),
    ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
])
def test_logged_urls_never_show_the_password(url: str, shown: str) -> None:
    assert redact_url(url) == shown
