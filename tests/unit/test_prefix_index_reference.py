"""The approximate index on the block table agrees with the index it replaced.

Random interleavings of record, match, remove, clear/forget, capacity changes and
TTL expiry on an injected clock, over three replicas sharing chains, for both
block tables (compiled and pure Python); the reference is the per-replica
OrderedDict index as it was (``reference_prefix_index``).
"""

from __future__ import annotations

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.block_table import compiled_available, compiled_tables, python_tables
from policies.prefix_index import ApproximatePrefixIndex

from .reference_prefix_index import ApproximatePrefixIndex as ReferenceIndex

REPLICAS = ["a", "b", "c"]
TTL = 5.0
FACTORIES = [
    pytest.param(python_tables, id="python"),
    pytest.param(compiled_tables, id="compiled",
                 marks=pytest.mark.skipif(not compiled_available(), reason="not built")),
]


def chain(path: tuple[int, ...]) -> list[int]:
    """Block ``i``'s hash stands for blocks ``0..i`` (as the gateway's chain hashes)."""
    return [xxhash.xxh3_64_intdigest(repr(path[: i + 1]).encode()) for i in range(len(path))]


paths = st.lists(st.integers(0, 2), min_size=0, max_size=10).map(tuple)
replicas = st.sampled_from(REPLICAS)
steps = st.sampled_from([0.0, 0.0, 0.5, 1.0, 2.5, 5.0, 6.0])  # ties, the TTL exactly, past it
operations = st.lists(
    st.one_of(
        st.tuples(st.just("record"), replicas, paths, steps),
        st.tuples(st.just("remove"), replicas, paths, st.integers(0, 1023)),
        st.tuples(st.just("capacity"), replicas, st.integers(1, 12)),
        st.tuples(st.just("clear"), replicas),
        st.tuples(st.just("forget"), replicas),
        st.tuples(st.just("expire"), steps),
        st.tuples(st.just("match"), paths, steps),
    ),
    max_size=60,
)


@pytest.mark.parametrize("factory", FACTORIES)
@settings(max_examples=200, deadline=None)
@given(ops=operations, probes=st.lists(paths, min_size=1, max_size=4))
def test_random_interleavings_agree_with_the_reference(factory, ops, probes):
    index = ApproximatePrefixIndex(ttl_seconds=TTL, default_capacity_blocks=8,
                                   table_factory=factory)
    reference = ReferenceIndex(ttl_seconds=TTL, default_capacity_blocks=8)
    now = 0.0
    for op, *args in ops:
        touched: list[int] = []
        if op == "record":
            replica, path, step = args
            now += step
            touched = chain(path)
            index.record(replica, touched, now)
            reference.record(replica, touched, now)
        elif op == "remove":
            replica, path, subset = args
            touched = [h for i, h in enumerate(chain(path)) if subset >> i & 1]
            index.remove(replica, touched)
            reference.remove(replica, touched)
        elif op == "capacity":
            replica, blocks = args
            index.set_capacity(replica, blocks)
            reference.set_capacity(replica, blocks)
        elif op in ("clear", "forget"):
            getattr(index, op if op == "clear" else "forget_replica")(args[0])
            getattr(reference, op if op == "clear" else "forget_replica")(args[0])
        elif op == "expire":
            now += args[0]
            assert index.expire(now) == reference.expire(now)
        else:
            path, step = args
            now += step
            touched = chain(path)
        assert index.replicas() == reference.replicas()
        for replica in REPLICAS:
            assert index.size(replica) == reference.size(replica)
            assert index.capacity(replica) == reference.capacity(replica)
            for block_hash in touched:
                assert index.contains(replica, block_hash, now) == reference.contains(
                    replica, block_hash, now)
        for probe in [touched, *map(chain, probes)]:
            assert index.match(probe, now) == reference.match(probe, now)
