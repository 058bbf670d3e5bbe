"""The precise index on the block table agrees with the index it replaced.

Random streams of KV events (stored with and without salts, removed, cleared, per
data-parallel rank, beyond the memory guard) interleaved with speculation, replica
restarts and matches on an injected clock, for both block tables; the reference
is the per-replica dict index as it was (``reference_precise_index``).
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.block_table import compiled_available, compiled_tables, python_tables
from policies.events import AllBlocksCleared, EventBatch, KVEvent
from policies.precise_index import PreciseIndex

from .reference_precise_index import PreciseIndex as ReferenceIndex
from .test_precise_index import MODEL, our_hashes, removed, stored

REPLICAS = ["a", "b", "c"]
FACTORIES = [
    pytest.param(python_tables, id="python"),
    pytest.param(compiled_tables, id="compiled",
                 marks=pytest.mark.skipif(not compiled_available(), reason="not built")),
]

paths = st.lists(st.integers(0, 2), min_size=1, max_size=5).map(tuple)
replicas = st.sampled_from(REPLICAS)
ranks = st.sampled_from([None, None, 0, 1])
salts = st.sampled_from([None, None, "s"])
steps = st.sampled_from([0.0, 0.0, 0.5, 2.0, 3.0])  # ties, the speculative TTL exactly, past it
operations = st.lists(
    st.one_of(
        st.tuples(st.just("store"), replicas, paths, st.integers(0, 4), salts, ranks),
        st.tuples(st.just("remove"), replicas, st.lists(paths, max_size=3), salts, ranks),
        st.tuples(st.just("clear"), replicas, ranks),
        st.tuples(st.just("forget"), replicas),
        st.tuples(st.just("record"), replicas, paths, salts, steps),
        st.tuples(st.just("match"), paths, salts, steps),
    ),
    max_size=60,
)


@pytest.mark.parametrize("factory", FACTORIES)
@settings(max_examples=200, deadline=None)
@given(ops=operations, probes=st.lists(st.tuples(paths, salts), min_size=1, max_size=4))
def test_random_event_streams_agree_with_the_reference(factory, ops, probes):
    index = PreciseIndex(max_blocks_per_replica=6, table_factory=factory)
    reference = ReferenceIndex(max_blocks_per_replica=6)
    for replica in REPLICAS:
        index.set_model(replica, MODEL)
        reference.set_model(replica, MODEL)
    now = 0.0
    for seq, (op, *args) in enumerate(ops):
        touched: list[int] = []
        if op in ("store", "remove", "clear"):
            replica, rank = args[0], args[-1]
            event: KVEvent
            if op == "store":
                path, first, salt = args[1:4]
                event = stored(path, min(first, len(path) - 1), salt=salt)
            elif op == "remove":
                event = removed(*args[1], salt=args[2])
            else:
                event = AllBlocksCleared()
            batch = EventBatch(seq=seq, timestamp=now, events=(event,), data_parallel_rank=rank)
            index.apply_events(replica, batch)
            reference.apply_events(replica, batch)
        elif op == "forget":
            index.forget_replica(args[0])
            reference.forget_replica(args[0])
        else:
            replica, path, salt, step = args if op == "record" else (None, *args)
            now += step
            touched = our_hashes(path, salt)
            if replica is not None:
                index.record(replica, touched, now)
                reference.record(replica, touched, now)
        assert index.replicas() == reference.replicas()
        for replica in REPLICAS:
            assert index.size(replica) == reference.size(replica)
            assert dataclasses.astuple(index.stats(replica)) == dataclasses.astuple(
                reference.stats(replica))
            for block_hash in touched:
                assert index.holds(replica, block_hash) == reference.holds(replica, block_hash)
        for probe in [touched, *(our_hashes(path, salt) for path, salt in probes)]:
            assert index.match(probe, now) == reference.match(probe, now)
