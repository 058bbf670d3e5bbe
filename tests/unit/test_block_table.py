"""The compiled block table and the pure-Python one behave alike, operation by operation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.block_table import (
    ReplicaSlots,
    compiled_available,
    compiled_tables,
    python_tables,
)

# Slots on both sides of the 64-bit mask words; hashes that collide modulo 2**64 (-1, 2**64-1).
SLOTS = [0, 1, 2, 63, 64, 65, 130, 200]
HASHES = st.one_of(st.integers(0, 7), st.sampled_from([-1, 2**64 - 1, 2**63, 2**64 + 3]))
STAMPS = st.integers(0, 8).map(float)

needs_compiled = pytest.mark.skipif(not compiled_available(),
                                    reason="policies._blocktable is not built")


def test_the_extension_is_built():
    """`pip install -e .` (make setup) builds it; without it the slow fallback serves."""
    assert compiled_available(), "policies._blocktable is not built: run `pip install -e .`"


def ids() -> list[str]:
    names = [""] * (max(SLOTS) + 1)
    for slot in SLOTS:
        names[slot] = f"r{slot}"
    return names


ordered_ops = st.lists(
    st.one_of(
        st.tuples(st.just("touch"), st.sampled_from(SLOTS), st.lists(HASHES, max_size=8), STAMPS,
                  st.booleans()),
        st.tuples(st.just("evict"), st.sampled_from(SLOTS), st.integers(-1, 6)),
        st.tuples(st.just("drop_stale"), st.sampled_from(SLOTS), STAMPS, st.booleans()),
        st.tuples(st.just("discard"), st.sampled_from(SLOTS), st.lists(HASHES, max_size=4)),
        st.tuples(st.just("clear"), st.sampled_from(SLOTS)),
        st.tuples(st.just("match"), st.lists(HASHES, max_size=10), STAMPS, st.booleans()),
    ),
    max_size=50,
)


@needs_compiled
@settings(max_examples=300, deadline=None)
@given(ordered_ops, st.lists(HASHES, max_size=10))
def test_ordered_tables_agree(ops, probe):
    compiled, python = compiled_tables(True), python_tables(True)
    names = ids()
    for op, *args in ops:
        if op == "match":
            hashes, threshold, strict = args
            assert compiled.match(hashes, names, threshold, strict) == python.match(
                hashes, names, threshold, strict)
            continue
        assert getattr(compiled, op)(*args) == getattr(python, op)(*args), (op, args)
        for slot in SLOTS:
            assert compiled.size(slot) == python.size(slot)
            for block_hash in probe:
                assert compiled.stamp(slot, block_hash) == python.stamp(slot, block_hash)
    for threshold in (0.0, 4.0):
        assert compiled.match(probe, names, threshold, False) == python.match(
            probe, names, threshold, False)


FEW_SLOTS = st.sampled_from([0, 64, 130])
counted_ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), FEW_SLOTS, HASHES),
        st.tuples(st.just("release"), FEW_SLOTS, HASHES),
        st.tuples(st.just("add_all"), FEW_SLOTS, st.lists(HASHES, max_size=6)),
        st.tuples(st.just("release_all"), FEW_SLOTS, st.lists(HASHES, max_size=6)),
        st.tuples(st.just("discard"), FEW_SLOTS, st.lists(HASHES, max_size=4)),
        st.tuples(st.just("clear"), FEW_SLOTS),
        st.tuples(st.just("speculate"), FEW_SLOTS, st.lists(HASHES, max_size=6), STAMPS),
        st.tuples(st.just("trim"), FEW_SLOTS, st.integers(0, 6), STAMPS),
        st.tuples(st.just("match"), st.lists(HASHES, max_size=10), STAMPS),
    ),
    max_size=60,
)


@needs_compiled
@settings(max_examples=400, deadline=None)
@given(counted_ops, st.lists(HASHES, max_size=10))
def test_counted_tables_with_speculation_agree(ops, probe):
    compiled = compiled_tables(False), compiled_tables(True)
    python = python_tables(False), python_tables(True)
    names = ids()
    for op, *args in ops:
        if op == "match":
            hashes, now = args
            assert compiled[0].match(hashes, names, now, True, compiled[1]) == python[0].match(
                hashes, names, now, True, python[1])
            assert compiled[0].match(hashes, names, now, True) == python[0].match(
                hashes, names, now, True)
            continue
        if op == "speculate":
            slot, hashes, stamp = args
            for _, speculative in (compiled, python):
                speculative.touch(slot, hashes, stamp, False)
            continue
        if op == "trim":
            slot, keep, now = args
            assert compiled[1].evict(slot, keep) == python[1].evict(slot, keep)
            assert compiled[1].drop_stale(slot, now, True) == python[1].drop_stale(slot, now, True)
            continue
        assert getattr(compiled[0], op)(*args) == getattr(python[0], op)(*args), (op, args)
        for slot in SLOTS:
            assert compiled[0].size(slot) == python[0].size(slot)
            for block_hash in probe:
                assert compiled[0].count(slot, block_hash) == python[0].count(slot, block_hash)
    assert compiled[0].match(probe, names, 3.0, True, compiled[1]) == python[0].match(
        probe, names, 3.0, True, python[1])


BOTH = [python_tables, pytest.param(compiled_tables, marks=needs_compiled)]


@pytest.mark.parametrize("factory", BOTH)
def test_an_expired_speculative_block_cuts_the_run_wherever_it_is(factory):
    confirmed, speculative = factory(False), factory(True)
    names = ["a", "b"]
    confirmed.add(0, 2)
    speculative.touch(0, [1], 9.0, False)  # fresh at 5
    speculative.touch(0, [3], 4.0, False)  # expired at 5
    speculative.touch(1, [1, 2, 3], 4.0, False)
    assert confirmed.match([1, 2, 3, 4], names, 5.0, True, speculative) == {"a": 2}
    assert confirmed.match([1, 2, 3, 4], names, 3.0, True, speculative) == {"a": 3, "b": 3}
    assert confirmed.match([2, 1], names, 5.0, True, speculative) == {"a": 2}


@pytest.mark.parametrize("factory", BOTH)
def test_a_stale_run_end_is_searched_back_to_the_fresh_part(factory):
    table = factory(True)
    table.touch(0, [1, 2, 3, 4], 1.0, True)
    table.touch(0, [1, 2], 5.0, True)
    assert table.match([1, 2, 3, 4], ["a"], 3.0, False) == {"a": 2}
    assert table.match([1, 2, 3, 4], ["a"], 1.0, False) == {"a": 4}
    assert table.match([1, 2, 3, 4], ["a"], 5.5, False) == {}


@pytest.mark.parametrize("factory", BOTH)
def test_a_table_of_many_blocks_and_replicas(factory):
    """Growth, shrinking, wide masks: 300 slots sharing and dropping 20k blocks."""
    table = factory(True)
    names = [f"r{slot}" for slot in range(300)]
    for slot in range(300):
        table.touch(slot, range(slot % 7, 20_000, 7), float(slot), True)
    assert table.match(list(range(0, 50, 7)), names, 0.0, False) == {
        f"r{slot}": 8 for slot in range(0, 300, 7)}
    for slot in range(300):
        table.evict(slot, 100 if slot % 2 else 0)
    assert sum(table.size(slot) for slot in range(300)) == 150 * 100
    for slot in range(300):
        table.clear(slot)
    assert table.match([0, 7], names, 0.0, False) == {}


def test_mismatched_tables_are_refused():
    for factory in [python_tables] + ([compiled_tables] if compiled_available() else []):
        with pytest.raises(TypeError):
            factory(True).add(0, 1)
        with pytest.raises(TypeError):
            factory(False).touch(0, [1], 0.0, False)
        with pytest.raises(TypeError):
            factory(True).match([1], ["a"], 0.0, False, factory(True))


def test_replica_slots_are_reused_lowest_first():
    slots = ReplicaSlots(max_slots=3)
    assert [slots.slot(name) for name in ("a", "b", "c")] == [0, 1, 2]
    with pytest.raises(ValueError):
        slots.slot("d")
    slots.release("b")
    slots.release("a")
    assert slots.slot("d") == 0
    assert slots.ids == ["d", "", "c"]
    assert slots.replicas() == ["c", "d"]
