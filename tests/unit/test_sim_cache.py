"""The simulator's block prefix cache: hits, LRU eviction, ref counts, salt, events."""

from __future__ import annotations

import pytest

from engine.sim.cache import PrefixCache
from engine.sim.events import ClearedAll, RemovedBlocks, StoredBlocks

BS = 4


def hashes_of(cache: PrefixCache, tokens: list[int], salt: str | None = None) -> list[int]:
    out: list[int] = []
    cache.extend_hashes(out, tokens, salt)
    return out


def store(cache: PrefixCache, tokens: list[int], salt: str | None = None) -> list[int]:
    """Compute and cache every full block of ``tokens``; returns the held block ids."""
    hashes = hashes_of(cache, tokens, salt)
    hit = cache.lookup(hashes, len(tokens) + 1)
    cache.acquire(hit)
    fresh = cache.allocate(len(hashes) - len(hit))
    assert fresh is not None
    blocks = hit + fresh
    cache.commit(blocks, hashes, tokens, len(hit), len(hashes), salt)
    return blocks


def test_only_full_blocks_are_hashed_and_the_chain_depends_on_every_earlier_block() -> None:
    cache = PrefixCache(num_blocks=16, block_size=BS)
    a = hashes_of(cache, list(range(10)))
    assert len(a) == 2  # 10 tokens = 2 full blocks + a partial one
    b = hashes_of(cache, [99] + list(range(1, 10)))
    assert a[0] != b[0] and a[1] != b[1]  # same second block, different parent
    assert all(0 <= value < 2**64 for value in a)


def test_a_repeated_prompt_hits_all_but_the_last_token_rounded_down_to_blocks() -> None:
    cache = PrefixCache(num_blocks=16, block_size=BS)
    tokens = list(range(12))  # exactly 3 blocks
    held = store(cache, tokens)
    cache.release(list(reversed(held)))
    hashes = hashes_of(cache, tokens)
    assert len(cache.lookup(hashes, len(tokens))) == 2  # (12 - 1) // 4
    longer = tokens + [50, 51]
    assert len(cache.lookup(hashes_of(cache, longer), len(longer))) == 3


def test_a_miss_in_the_middle_stops_the_hit() -> None:
    cache = PrefixCache(num_blocks=16, block_size=BS)
    held = store(cache, list(range(12)))
    cache.release(list(reversed(held)))
    other = list(range(4)) + [7, 7, 7, 7] + list(range(8, 12)) + [1]
    assert len(cache.lookup(hashes_of(cache, other), len(other))) == 1


def test_cache_salt_changes_every_hash_and_keeps_tenants_apart() -> None:
    cache = PrefixCache(num_blocks=16, block_size=BS)
    tokens = list(range(9))
    plain, salted, other = (
        hashes_of(cache, tokens, salt) for salt in (None, "tenant-a", "tenant-b")
    )
    assert len({plain[0], salted[0], other[0]}) == 3
    assert len({plain[1], salted[1], other[1]}) == 3
    held = store(cache, tokens, "tenant-a")
    cache.release(list(reversed(held)))
    assert len(cache.lookup(salted, len(tokens))) == 2
    assert cache.lookup(plain, len(tokens)) == []
    assert cache.lookup(other, len(tokens)) == []


def test_held_blocks_are_never_evicted_and_shared_blocks_need_every_release() -> None:
    cache = PrefixCache(num_blocks=4, block_size=BS)
    tokens = list(range(8))
    first = store(cache, tokens)
    second_hit = cache.lookup(hashes_of(cache, tokens), len(tokens) + 1)
    cache.acquire(second_hit)
    assert [cache.ref_count(block) for block in first] == [2, 2]
    cache.release(list(reversed(first)))
    assert [cache.ref_count(block) for block in first] == [1, 1]
    assert cache.allocate(3) is None  # only 2 blocks are free
    assert cache.num_free_blocks == 2
    cache.release(list(reversed(second_hit)))
    assert cache.num_free_blocks == 4
    with pytest.raises(RuntimeError):
        cache.release([first[0]])


def test_eviction_is_least_recently_freed_first_and_a_request_tail_goes_first() -> None:
    cache = PrefixCache(num_blocks=4, block_size=BS)
    a = store(cache, list(range(8)))  # 2 blocks
    b = store(cache, list(range(100, 108)))  # 2 blocks
    cache.release(list(reversed(a)))
    cache.release(list(reversed(b)))
    assert cache.eviction_order() == [a[1], a[0], b[1], b[0]]
    cache.take_events()
    cache.allocate(1)
    assert cache.take_events() == [
        RemovedBlocks(block_hashes=(hashes_of(cache, list(range(8)))[1],))
    ]
    # A hit takes the block out of the queue; releasing puts it at the tail.
    hit = cache.lookup(hashes_of(cache, list(range(100, 108))), 9)
    cache.acquire(hit)
    cache.release(list(reversed(hit)))
    assert cache.eviction_order() == [a[0], b[1], b[0]]


def test_a_freed_partial_block_is_reused_before_any_cached_block_is_evicted() -> None:
    # vLLM 0.32's BlockPool.free_blocks: a block with no hash goes to the head of the
    # free queue; queued at the tail, each finished request would evict a cached block.
    cache = PrefixCache(num_blocks=6, block_size=BS)
    tokens = list(range(9))  # 2 full blocks and a partial one
    hashes = hashes_of(cache, tokens)
    blocks = cache.allocate(3)
    assert blocks is not None
    cache.commit(blocks, hashes, tokens, 0, 2, None)
    cache.release(list(reversed(blocks)))
    assert cache.eviction_order()[0] == blocks[2]
    assert cache.eviction_order()[-2:] == [blocks[1], blocks[0]]
    cache.take_events()
    again = cache.allocate(1)
    assert again == [blocks[2]] and cache.take_events() == []
    assert len(cache.lookup(hashes, len(tokens))) == 2


def test_without_a_subscriber_no_events_are_kept_and_the_cache_works_the_same() -> None:
    quiet = PrefixCache(num_blocks=2, block_size=BS, record_events=False)
    tokens = list(range(8))
    blocks = store(quiet, tokens)
    assert len(quiet.lookup(hashes_of(quiet, tokens), 9)) == 2
    quiet.release(list(reversed(blocks)))
    assert quiet.allocate(2) is not None and not quiet.is_cached(hashes_of(quiet, tokens)[0])
    quiet.release(list(range(2)))
    assert quiet.reset() and quiet.take_events() == []


def test_commit_records_block_stored_with_parent_tokens_and_salt() -> None:
    cache = PrefixCache(num_blocks=8, block_size=BS)
    tokens = list(range(13))
    hashes = hashes_of(cache, tokens, "s")
    blocks = cache.allocate(3)
    assert blocks is not None
    assert cache.commit(blocks, hashes, tokens, 0, 1, "s") == 1
    assert cache.commit(blocks, hashes, tokens, 1, 3, "s") == 3
    first, rest = cache.take_events()
    assert first == StoredBlocks((hashes[0],), None, tuple(range(4)), BS, (("s",),))
    assert rest == StoredBlocks(
        (hashes[1], hashes[2]), hashes[0], tuple(range(4, 12)), BS, (None, None)
    )


def test_reset_is_refused_while_blocks_are_held_and_clears_everything_after() -> None:
    cache = PrefixCache(num_blocks=8, block_size=BS)
    tokens = list(range(8))
    held = store(cache, tokens)
    cache.take_events()
    assert cache.reset() is False
    assert cache.take_events() == []
    cache.release(list(reversed(held)))
    assert cache.reset() is True
    assert cache.take_events() == [ClearedAll()]
    assert cache.lookup(hashes_of(cache, tokens), len(tokens) + 1) == []
    assert cache.usage == 0.0


def test_the_engine_key_space_follows_the_seed() -> None:
    tokens = list(range(8))
    assert hashes_of(PrefixCache(4, BS, seed=1), tokens) != hashes_of(
        PrefixCache(4, BS, seed=2), tokens
    )
    assert hashes_of(PrefixCache(4, BS, seed=1), tokens) == hashes_of(
        PrefixCache(4, BS, seed=1), tokens
    )
