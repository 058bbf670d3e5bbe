"""The precise index: KV events replayed into our own chain hashes (cache salts included)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.kv_events import decode_payload
from policies.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from policies.hashing import block_hashes, chain_seed
from policies.precise_index import PreciseIndex

BLOCK = 2
MODEL = "m"
SEED = chain_seed(MODEL, None)
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"


def block_tokens(choice: int) -> tuple[int, ...]:
    return (choice, 100 + choice)


def our_hashes(path: tuple[int, ...], salt: str | None = None) -> list[int]:
    """What the gateway computes for a request: seeded with ``chain_seed(model, salt)``."""
    tokens = [t for choice in path for t in block_tokens(choice)]
    return block_hashes(tokens, BLOCK, chain_seed(MODEL, salt))


def engine_hash(path: tuple[int, ...], salt: str | None = None) -> int:
    """The engine's hash of the last block of ``path``: a key space unlike ours
    (vLLM mixes the salt into block 0, so every later hash differs too)."""
    return xxhash.xxh64_intdigest(repr((salt, path)).encode())


def stored(
    path: tuple[int, ...], first: int, medium: str | None = "GPU", salt: str | None = None
) -> BlockStored:
    """The engine stores blocks ``first ..`` of ``path`` (their parent is block first-1),
    for a request with ``salt``: as vLLM, the salt travels with block 0 only."""
    return BlockStored(
        block_hashes=tuple(engine_hash(path[: i + 1], salt) for i in range(first, len(path))),
        parent_block_hash=engine_hash(path[:first], salt) if first else None,
        token_ids=tuple(t for choice in path[first:] for t in block_tokens(choice)),
        block_size=BLOCK,
        medium=medium,
        cache_salt=salt if first == 0 else None,
    )


def removed(*paths: tuple[int, ...], salt: str | None = None) -> BlockRemoved:
    return BlockRemoved(block_hashes=tuple(engine_hash(p, salt) for p in paths), medium="GPU")


def make_index() -> PreciseIndex:
    index = PreciseIndex()
    index.set_model("r", MODEL)
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
salts = st.sampled_from([None, "s1", "s2"])
event_ops = st.lists(
    st.one_of(
        st.tuples(st.just("store"), st.sampled_from(["a", "b"]), paths, st.integers(0, 3), salts),
        st.tuples(st.just("remove"), st.sampled_from(["a", "b"]), paths, st.just(0), salts),
        st.tuples(st.just("clear"), st.sampled_from(["a", "b"]), st.just(()), st.just(0),
                  st.just(None)),
    ),
    max_size=40,
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(event_ops, st.lists(st.tuples(paths, salts), min_size=1, max_size=5))
def test_random_interleavings_agree_with_a_reference_model(ops, probes):
    """Model check: the reference keeps the set of (salt, block *path*) each replica stores;
    a request matches only the blocks stored under its own salt."""
    index = PreciseIndex()
    for replica in ("a", "b"):
        index.set_model(replica, MODEL)
    held: dict[str, set[tuple[str | None, tuple[int, ...]]]] = {"a": set(), "b": set()}
    orphans = {"a": 0, "b": 0}
    for op, replica, path, first, salt in ops:
        if op == "store":
            first = min(first, len(path) - 1)
            if first == 0 or (salt, path[:first]) in held[replica]:
                held[replica] |= {(salt, path[: i + 1]) for i in range(first, len(path))}
            else:
                orphans[replica] += len(path) - first
            index.apply(replica, stored(path, first, salt=salt))
        elif op == "remove":
            held[replica].discard((salt, path))
            index.apply(replica, removed(path, salt=salt))
        else:
            held[replica].clear()
            index.apply(replica, AllBlocksCleared())
        for name in ("a", "b"):
            assert index.size(name) == len(held[name])
            assert index.stats(name).orphan_blocks == orphans[name]
        for probe, probe_salt in probes:
            expected = {}
            for name in ("a", "b"):
                run = 0
                while run < len(probe) and (probe_salt, probe[: run + 1]) in held[name]:
                    run += 1
                if run:
                    expected[name] = run
            assert index.match(our_hashes(probe, probe_salt), now=0.0) == expected


# -- cache salts ----------------------------------------------------------------------------------


def test_a_salted_chain_matches_requests_with_that_salt_only():
    index = make_index()
    index.apply("r", stored((1, 2), 0, salt="tenant-a"))
    assert index.match(our_hashes((1, 2), "tenant-a"), now=0.0) == {"r": 2}
    assert index.match(our_hashes((1, 2)), now=0.0) == {}  # no salt never matches salted blocks
    assert index.match(our_hashes((1, 2), "tenant-b"), now=0.0) == {}
    assert index.stats("r").salted_roots == 1


def test_unsalted_blocks_do_not_match_salted_requests():
    index = make_index()
    index.apply("r", stored((1, 2), 0))
    assert index.match(our_hashes((1, 2), "tenant-a"), now=0.0) == {}
    assert index.match(our_hashes((1, 2)), now=0.0) == {"r": 2}
    assert index.stats("r").salted_roots == 0


def test_blocks_chained_onto_a_known_salted_block_continue_its_chain():
    index = make_index()
    index.apply("r", stored((1,), 0, salt="tenant-a"))
    index.apply("r", stored((1, 2, 0), 1, salt="tenant-a"))  # parent known, no salt of its own
    assert index.match(our_hashes((1, 2, 0), "tenant-a"), now=0.0) == {"r": 3}
    assert index.match(our_hashes((1, 2, 0)), now=0.0) == {}


def test_a_salted_first_block_with_a_parent_we_do_not_know_starts_the_salted_chain():
    index = make_index()
    event = BlockStored(
        block_hashes=(engine_hash((1,), "s"), engine_hash((1, 2), "s")),
        parent_block_hash=12345,  # not a block we know: the salt says this is block 0
        token_ids=(1, 101, 2, 102),
        block_size=BLOCK,
        cache_salt="s",
    )
    index.apply("r", event)
    assert index.match(our_hashes((1, 2), "s"), now=0.0) == {"r": 2}
    assert index.stats("r").orphan_blocks == 0


def test_a_known_parent_wins_over_a_salt():
    index = make_index()
    index.apply("r", stored((1,), 0))
    event = BlockStored(
        block_hashes=(engine_hash((1, 2)),),
        parent_block_hash=engine_hash((1,)),
        token_ids=(2, 102),
        block_size=BLOCK,
        cache_salt="s",
    )
    index.apply("r", event)
    assert index.match(our_hashes((1, 2)), now=0.0) == {"r": 2}


def test_salted_root_blocks_need_the_model_name():
    index = PreciseIndex()
    index.set_seed("r", SEED)  # a seed alone cannot be salted
    index.apply("r", stored((1,), 0, salt="s"))
    assert index.stats("r").orphan_blocks == 1
    index.apply("r", stored((2,), 0))
    assert index.size("r") == 1
    index.set_model("r", MODEL)
    index.set_seed("r", SEED)  # back to a bare seed: the model is forgotten
    index.apply("r", stored((3,), 0, salt="s"))
    assert index.stats("r").orphan_blocks == 2


def test_salted_lora_blocks_use_the_adapters_model_name():
    index = make_index()
    index.set_model("r", "m-adapter", lora_id=3)
    event = BlockStored(
        block_hashes=(7,), parent_block_hash=None, token_ids=(1, 101), block_size=2, lora_id=3,
        lora_name="m-adapter", cache_salt="s",
    )  # fmt: skip
    index.apply("r", event)
    assert index.holds("r", block_hashes([1, 101], 2, chain_seed("m-adapter", "s"))[0])
    assert not index.holds("r", block_hashes([1, 101], 2, chain_seed(MODEL, "s"))[0])


def test_events_vllm_published_for_salted_chats_index_where_requests_look():
    """The captured vLLM 0.32 salted chats: each request's gateway hashes find its blocks."""
    data = json.loads((FIXTURES / "kv_events_salted.json").read_text(encoding="utf-8"))
    index = PreciseIndex()
    index.set_model("r", "qwen2-tiny")
    for message in data["messages"]:
        index.apply("r", decode_payload(base64.b64decode(message["payload_b64"]), message["seq"]))
    first, second = data["prompts"]["first"], data["prompts"]["second"]

    def matched(tokens: list[int], salt: str | None) -> int:
        hashes = block_hashes(tokens, 32, chain_seed("qwen2-tiny", salt))
        return index.match(hashes, now=0.0).get("r", 0)

    assert matched(first, "tenant-a") == 1 and matched(second, "tenant-a") == 2
    assert matched(second, "tenant-b") == 2
    assert matched(first, None) == 1 and matched(second, None) == 1
    assert matched(second, "tenant-c") == 0
    assert index.stats("r").orphan_blocks == 0
