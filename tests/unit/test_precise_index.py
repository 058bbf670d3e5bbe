"""The precise index: KV events replayed into our own chain hashes."""

from __future__ import annotations

import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from policies.hashing import block_hashes, chain_seed
from policies.precise_index import PreciseIndex

BLOCK = 2
SEED = chain_seed("m", None)


def block_tokens(choice: int) -> tuple[int, ...]:
    return (choice, 100 + choice)


def our_hashes(path: tuple[int, ...]) -> list[int]:
    tokens = [t for choice in path for t in block_tokens(choice)]
    return block_hashes(tokens, BLOCK, SEED)


def engine_hash(path: tuple[int, ...]) -> int:
    """The engine's hash of the last block of ``path``: a key space unlike ours."""
    return xxhash.xxh64_intdigest(repr(path).encode())


def stored(path: tuple[int, ...], first: int, medium: str | None = "GPU") -> BlockStored:
    """The engine stores blocks ``first ..`` of ``path`` (their parent is block first-1)."""
    return BlockStored(
        block_hashes=tuple(engine_hash(path[: i + 1]) for i in range(first, len(path))),
        parent_block_hash=engine_hash(path[:first]) if first else None,
        token_ids=tuple(t for choice in path[first:] for t in block_tokens(choice)),
        block_size=BLOCK,
        medium=medium,
    )


def removed(*paths: tuple[int, ...]) -> BlockRemoved:
    return BlockRemoved(block_hashes=tuple(engine_hash(p) for p in paths), medium="GPU")


def make_index() -> PreciseIndex:
    index = PreciseIndex()
    index.set_seed("r", SEED)
    return index


def test_stored_chains_match_in_our_key_space():
    index = make_index()
    index.apply("r", stored((1, 2), 0))
    index.apply("r", stored((1, 2, 0), 2))
    assert index.match(our_hashes((1, 2, 0, 1)), now=0.0) == {"r": 3}
    assert index.match(our_hashes((2,)), now=0.0) == {}


def test_removed_blocks_and_cleared_replicas_are_gone():
    index = make_index()
    index.apply("r", stored((1, 2, 0), 0))
    index.apply("r", removed((1, 2)))
    assert index.match(our_hashes((1, 2, 0)), now=0.0) == {"r": 1}
    assert index.holds("r", our_hashes((1, 2, 0))[2])
    index.apply("r", EventBatch(seq=1, timestamp=0.0, events=(AllBlocksCleared(),)))
    assert index.size("r") == 0


def test_unknown_parents_are_counted_as_orphans_and_skipped():
    index = make_index()
    index.apply("r", stored((1, 2, 0), 2))
    assert index.size("r") == 0
    assert index.stats("r").orphan_blocks == 1
    unseeded = PreciseIndex()
    unseeded.apply("r", stored((1,), 0))
    assert unseeded.stats("r").orphan_blocks == 1


def test_other_media_are_ignored():
    index = make_index()
    index.apply("r", stored((1, 2), 0, medium="CPU"))
    assert index.size("r") == 0
    assert index.stats("r").ignored_blocks == 2
    index.apply("r", stored((1, 2), 0, medium="gpu"))
    index.apply("r", BlockRemoved(block_hashes=(engine_hash((1,)),), medium="CPU"))
    assert index.size("r") == 2


def test_short_token_ids_are_malformed():
    index = make_index()
    event = BlockStored(
        block_hashes=(1, 2), parent_block_hash=None, token_ids=(1, 2, 3), block_size=2
    )
    index.apply("r", event)
    assert index.stats("r").malformed_events == 1


def test_lora_root_blocks_need_their_own_seed():
    index = make_index()
    lora_event = BlockStored(
        block_hashes=(7,), parent_block_hash=None, token_ids=(1, 101), block_size=2, lora_id=3
    )
    index.apply("r", lora_event)
    assert index.stats("r").orphan_blocks == 1
    lora_seed = chain_seed("m-adapter", None)
    index.set_seed("r", lora_seed, lora_id=3)
    index.apply("r", lora_event)
    assert index.holds("r", block_hashes([1, 101], 2, lora_seed)[0])


def test_data_parallel_ranks_are_separate_caches():
    index = make_index()
    for rank in (0, 1):
        index.apply(
            "r",
            EventBatch(seq=rank, timestamp=0.0, events=(stored((1,), 0),), data_parallel_rank=rank),
        )
    index.apply(
        "r", EventBatch(seq=2, timestamp=0.0, events=(removed((1,)),), data_parallel_rank=0)
    )
    assert index.match(our_hashes((1,)), now=0.0) == {"r": 1}
    index.apply(
        "r", EventBatch(seq=3, timestamp=0.0, events=(AllBlocksCleared(),), data_parallel_rank=1)
    )
    assert index.match(our_hashes((1,)), now=0.0) == {}


def test_speculative_blocks_count_until_their_ttl():
    index = PreciseIndex(speculative_ttl_seconds=2.0)
    hashes = our_hashes((1, 2))
    index.speculate("r", hashes, now=10.0)
    assert index.match(hashes, now=11.9) == {"r": 2}
    assert index.match(hashes, now=12.0) == {}
    assert index.size("r") == 0
    index.speculate("r", hashes[:1], now=20.0)
    assert index.stats("r").speculative_blocks == 1


def test_clear_keeps_seeds():
    index = make_index()
    index.apply("r", stored((1,), 0))
    index.clear("r")
    assert index.size("r") == 0
    index.apply("r", stored((2,), 0))
    assert index.size("r") == 1


def test_memory_guard_drops_the_oldest_mappings():
    index = PreciseIndex(max_blocks_per_replica=2)
    index.set_seed("r", SEED)
    index.apply("r", stored((1, 2, 0), 0))
    assert index.size("r") == 2
    assert index.stats("r").overflow_drops == 1
    assert not index.holds("r", our_hashes((1,))[0])


paths = st.lists(st.integers(min_value=0, max_value=2), min_size=1, max_size=4).map(tuple)
event_ops = st.lists(
    st.one_of(
        st.tuples(st.just("store"), st.sampled_from(["a", "b"]), paths, st.integers(0, 3)),
        st.tuples(st.just("remove"), st.sampled_from(["a", "b"]), paths, st.just(0)),
        st.tuples(st.just("clear"), st.sampled_from(["a", "b"]), st.just(()), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(event_ops, st.lists(paths, min_size=1, max_size=5))
def test_random_interleavings_agree_with_a_reference_model(ops, probes):
    """Model check: the reference keeps the set of block *paths* each replica stores."""
    index = PreciseIndex()
    for replica in ("a", "b"):
        index.set_seed(replica, SEED)
    held: dict[str, set[tuple[int, ...]]] = {"a": set(), "b": set()}
    orphans = {"a": 0, "b": 0}
    for op, replica, path, first in ops:
        if op == "store":
            first = min(first, len(path) - 1)
            if first == 0 or path[:first] in held[replica]:
                held[replica] |= {path[: i + 1] for i in range(first, len(path))}
            else:
                orphans[replica] += len(path) - first
            index.apply(replica, stored(path, first))
        elif op == "remove":
            held[replica].discard(path)
            index.apply(replica, removed(path))
        else:
            held[replica].clear()
            index.apply(replica, AllBlocksCleared())
        for name in ("a", "b"):
            assert index.size(name) == len(held[name])
            assert index.stats(name).orphan_blocks == orphans[name]
        for probe in probes:
            expected = {}
            for name in ("a", "b"):
                run = 0
                while run < len(probe) and probe[: run + 1] in held[name]:
                    run += 1
                if run:
                    expected[name] = run
            assert index.match(our_hashes(probe), now=0.0) == expected
