"""Block hashing: the chain format, full blocks only, incremental extension."""

from __future__ import annotations

import struct
from array import array

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.hashing import block_hashes, chain_seed, extend

tokens = st.lists(st.integers(min_value=0, max_value=2**32 - 1), max_size=200)
block_sizes = st.sampled_from([1, 2, 3, 16, 32])


def reference_chain(token_ids: list[int], block_size: int, seed: int) -> list[int]:
    """The documented format, written the slow obvious way."""
    hashes = []
    parent = seed
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        block = token_ids[start : start + block_size]
        payload = struct.pack("<Q", parent) + struct.pack(f"<{block_size}I", *block)
        parent = xxhash.xxh3_64_intdigest(payload)
        hashes.append(parent)
    return hashes


@settings(max_examples=200, deadline=None)
@given(tokens, block_sizes, st.integers(min_value=0, max_value=2**64 - 1))
def test_matches_the_documented_format(token_ids, block_size, seed):
    assert block_hashes(token_ids, block_size, seed) == reference_chain(token_ids, block_size, seed)


@settings(max_examples=200, deadline=None)
@given(tokens, tokens, block_sizes)
def test_extend_continues_a_memoized_prefix(prefix, tail, block_size):
    seed = chain_seed("m", None)
    whole_blocks = len(prefix) // block_size * block_size
    stable = prefix[:whole_blocks]
    known = block_hashes(stable, block_size, seed)
    parent = known[-1] if known else seed
    assert known + extend(parent, tail, block_size) == block_hashes(stable + tail, block_size, seed)


@given(tokens, block_sizes)
def test_only_full_blocks_are_hashed(token_ids, block_size):
    assert len(block_hashes(token_ids, block_size, 7)) == len(token_ids) // block_size


def test_one_changed_token_changes_its_block_and_every_later_one():
    base = list(range(64))
    changed = base.copy()
    changed[20] = 999
    first, second = block_hashes(base, 16, 1), block_hashes(changed, 16, 1)
    assert first[0] == second[0]
    assert all(a != b for a, b in zip(first[1:], second[1:]))


def test_array_and_list_inputs_agree():
    token_ids = list(range(1000, 1320))
    assert block_hashes(array("I", token_ids), 16, 5) == block_hashes(token_ids, 16, 5)
    assert block_hashes(tuple(token_ids), 16, 5) == block_hashes(token_ids, 16, 5)


def test_seeds_separate_models_and_salts():
    seeds = {
        chain_seed("qwen", None),
        chain_seed("qwen", ""),
        chain_seed("qwen", "tenant-a"),
        chain_seed("llama", None),
    }
    assert len(seeds) == 4
    assert chain_seed("qwen", "tenant-a") == chain_seed("qwen", "tenant-a")


def test_bad_input_is_an_error():
    with pytest.raises(ValueError):
        block_hashes([1, -2, 3], 1, 0)
    with pytest.raises(ValueError):
        block_hashes([1, 2, 3], 0, 0)
