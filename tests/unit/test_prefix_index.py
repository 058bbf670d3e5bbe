"""The approximate prefix index: leading matches, capacity, LRU order, TTL."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.prefix_index import ApproximatePrefixIndex


def test_match_counts_the_leading_run_only():
    index = ApproximatePrefixIndex()
    index.record("a", [1, 2, 3, 4], now=0.0)
    index.record("b", [1, 2], now=0.0)
    assert index.match([1, 2, 3, 9], now=1.0) == {"a": 3, "b": 2}
    assert index.match([9, 10, 11], now=1.0) == {}
    index.remove("a", [2])
    assert index.match([1, 2, 3], now=1.0) == {"a": 1, "b": 2}


def test_capacity_evicts_least_recently_used_first():
    index = ApproximatePrefixIndex()
    index.set_capacity("a", 4)
    index.record("a", [1, 2], now=0.0)
    index.record("a", [3, 4], now=1.0)
    index.record("a", [1, 2], now=2.0)  # touch: 4 then 3 are now the oldest
    index.record("a", [5], now=3.0)
    assert index.size("a") == 4
    assert not index.contains("a", 4, now=3.0)  # a tail goes before its prefix
    assert index.contains("a", 3, now=3.0)
    assert index.match([1, 2], now=3.0) == {"a": 2}


def test_a_requests_tail_is_evicted_before_its_shared_prefix():
    index = ApproximatePrefixIndex()
    index.set_capacity("a", 3)
    index.record("a", [1, 2, 3, 4, 5], now=0.0)
    assert index.match([1, 2, 3, 4, 5], now=0.0) == {"a": 3}


def test_shrinking_capacity_evicts_at_once():
    index = ApproximatePrefixIndex()
    index.record("a", list(range(10)), now=0.0)
    index.set_capacity("a", 4)
    assert index.size("a") == 4
    assert index.match(list(range(10)), now=0.0) == {"a": 4}


def test_stale_entries_do_not_match_and_are_dropped():
    index = ApproximatePrefixIndex(ttl_seconds=10.0)
    index.record("a", [1, 2], now=0.0)
    index.record("b", [1, 2], now=5.0)
    assert index.match([1, 2], now=9.0) == {"a": 2, "b": 2}
    assert index.match([1, 2], now=12.0) == {"b": 2}
    index.record("a", [7], now=12.0)
    assert index.size("a") == 1
    assert index.expire(now=100.0) == 3


def test_clear_forgets_a_replica_but_keeps_its_capacity():
    index = ApproximatePrefixIndex()
    index.set_capacity("a", 5)
    index.record("a", [1, 2], now=0.0)
    index.clear("a")
    assert index.match([1, 2], now=0.0) == {}
    assert index.capacity("a") == 5


def test_match_does_not_change_the_index():
    index = ApproximatePrefixIndex(ttl_seconds=1.0)
    index.record("a", [1, 2], now=0.0)
    index.match([1, 2], now=50.0)
    assert index.size("a") == 2


operations = st.lists(
    st.tuples(
        st.sampled_from(["record", "remove", "capacity", "clear"]),
        st.sampled_from(["a", "b"]),
        # a prompt's blocks as contents; hashed as a chain below, as the gateway does
        st.lists(st.integers(min_value=0, max_value=2), max_size=12),
        st.integers(min_value=1, max_value=12),
        st.floats(min_value=0.0, max_value=3.0),
    ),
    max_size=60,
)


def chain(contents: list[int]) -> list[int]:
    """Each block's hash stands for the block and everything before it."""
    return [hash(tuple(contents[: i + 1])) for i in range(len(contents))]


@settings(max_examples=150, deadline=None)
@given(operations)
def test_agrees_with_a_naive_reference(ops):
    """Capacity is never exceeded; LRU order, TTL and leading matches as a list model says."""
    ttl = 5.0
    index = ApproximatePrefixIndex(ttl_seconds=ttl, default_capacity_blocks=8)
    reference: dict[str, list[tuple[int, float]]] = {"a": [], "b": []}  # oldest first
    capacity = {"a": 8, "b": 8}
    now = 0.0
    for op, replica, contents, blocks, step in ops:
        hashes = chain(contents)
        now += step
        entries = reference[replica]
        if op == "record":
            for block_hash in reversed(hashes):
                entries[:] = [e for e in entries if e[0] != block_hash] + [(block_hash, now)]
            del entries[: max(0, len(entries) - capacity[replica])]
            entries[:] = [e for e in entries if e[1] >= now - ttl]
            index.record(replica, hashes, now)
        elif op == "remove":
            entries[:] = [e for e in entries if e[0] not in hashes]
            index.remove(replica, hashes)
        elif op == "capacity":
            capacity[replica] = blocks
            del entries[: max(0, len(entries) - blocks)]
            index.set_capacity(replica, blocks)
        else:
            entries.clear()
            index.clear(replica)
        for name in ("a", "b"):
            assert index.size(name) == len(reference[name]) <= capacity[name]
        probe = hashes or [0]
        expected = {}
        for name, name_entries in reference.items():
            fresh = {h for h, touched in name_entries if touched >= now - ttl}
            run = 0
            while run < len(probe) and probe[run] in fresh:
                run += 1
            if run:
                expected[name] = run
        assert index.match(probe, now) == expected
