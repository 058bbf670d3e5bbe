"""The gateway's rendering and block hashing: exact token ids, memoization."""

from __future__ import annotations

import gc

import pytest

from engine.tokenizer import ByteRenderer, HFRenderer
from gateway.prompt.render import PromptHasher
from policies.hashing import block_hashes, chain_seed

from ..chat_corpus import CHATS


@pytest.mark.parametrize("chat", CHATS, ids=range(len(CHATS)))
def test_memoized_pieces_give_the_tokenizers_own_ids(qwen: HFRenderer, chat: dict) -> None:
    hasher = PromptHasher(qwen)
    assert hasher._split is not None  # the Qwen tokenizer splits on added tokens
    expected = qwen._tokenizer.encode(qwen.render_chat(chat), add_special_tokens=False).ids
    for _ in range(2):  # cold, then warm from the memo
        described = hasher.describe("m", chat, "chat", 16)
        assert described.prompt_tokens == len(expected)
        assert list(described.block_hashes) == block_hashes(expected, 16, chain_seed("m", None))
    assert hasher.token_ids("m", chat, "chat") == expected


def test_growing_conversation_reuses_chain(qwen: HFRenderer) -> None:
    hasher = PromptHasher(qwen)
    messages = [{"role": "system", "content": "policy text " * 200}]
    previous: tuple[int, ...] = ()
    for turn in range(5):
        messages = messages + [{"role": "user", "content": f"question {turn} " * 30}]
        described = hasher.describe("m", {"messages": messages}, "chat", 32)
        ids = qwen.chat_token_ids({"messages": messages})
        assert list(described.block_hashes) == block_hashes(ids, 32, chain_seed("m", None))
        # the earlier conversation's blocks are a prefix of this one's
        keep = max(0, len(previous) - 1)  # the generation prompt's block may differ
        assert described.block_hashes[:keep] == previous[:keep]
        previous = described.block_hashes
        messages = messages + [{"role": "assistant", "content": f"answer {turn} " * 20}]


def test_salt_and_model_separate_chains(qwen: HFRenderer) -> None:
    hasher = PromptHasher(qwen)
    chat = {"messages": [{"role": "user", "content": "same words " * 100}]}
    plain = hasher.describe("m", chat, "chat", 16).block_hashes
    salted = hasher.describe("m", {**chat, "cache_salt": "tenant-a"}, "chat", 16).block_hashes
    other_model = hasher.describe("m2", chat, "chat", 16).block_hashes
    assert plain and not set(plain) & set(salted) and not set(plain) & set(other_model)


def test_completions_prompts_text_and_ids(qwen: HFRenderer) -> None:
    hasher = PromptHasher(qwen)
    text = "Once upon a time " * 40
    ids = qwen.text_token_ids(text, add_special_tokens=True)
    described = hasher.describe("m", {"prompt": text}, "completions", 16)
    assert described.prompt_tokens == len(ids)
    from_ids = hasher.describe("m", {"prompt": ids}, "completions", 16)
    assert from_ids.block_hashes == described.block_hashes
    batch = hasher.describe("m", {"prompt": [text, "other"]}, "completions", 16)
    assert batch.block_hashes == described.block_hashes


def test_unrenderable_request_routes_without_hashes() -> None:
    hasher = PromptHasher(ByteRenderer())
    described = hasher.describe("m", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:..."}}]}]}, "chat", 16)
    assert described.block_hashes == () and described.prompt_tokens == 0


def test_the_memos_leave_nothing_for_the_garbage_collector_to_walk(qwen: HFRenderer) -> None:
    # A long-running gateway memoizes up to millions of pieces and chain states;
    # objects the cyclic collector tracks there would make each full collection
    # walk all of them (a pause of the whole gateway). Plain tuples of ints
    # and strings are untracked by the collections that see them (nested ones
    # take one pass per level).
    hasher = PromptHasher(qwen)
    for i in range(50):
        hasher.describe("m", {"messages": [{"role": "system", "content": f"app {i % 5} " * 40},
                                           {"role": "user", "content": f"question {i}"}]},
                        "chat", 16)
    for _ in range(5):  # a server collects all the time; one pass per nesting level
        gc.collect()
    for memo in (hasher._chain, hasher._pieces):
        entries = list(memo._data.items())
        assert len(entries) >= 50
        assert not any(gc.is_tracked(key) or gc.is_tracked(value) for key, value in entries)


class CountingRenderer:
    """The real Qwen renderer, counting the characters it tokenizes."""

    def __init__(self, inner: HFRenderer) -> None:
        self.inner = inner
        self.tokenized_chars = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def text_token_ids(self, text: str, add_special_tokens: bool = False) -> list[int]:
        self.tokenized_chars += len(text)
        return self.inner.text_token_ids(text, add_special_tokens=add_special_tokens)

    def encode_with_offsets(self, text: str) -> object:
        self.tokenized_chars += len(text)
        return self.inner.encode_with_offsets(text)


async def test_a_burst_behind_a_new_long_prefix_tokenizes_it_once(qwen: HFRenderer) -> None:
    """100 requests at once behind a system prompt the gateway has never seen: the first
    tokenizes it, the others wait for that, and every request gets its exact blocks."""
    import asyncio

    renderer = CountingRenderer(qwen)
    hasher = PromptHasher(renderer)  # type: ignore[arg-type]
    system = " ".join(f"rule {i} of the house policy;" for i in range(2000))  # ~56k chars
    chats = [{"messages": [{"role": "system", "content": system},
                           {"role": "user", "content": f"question number {i}?"}]}
             for i in range(100)]
    renderer.tokenized_chars = 0
    described = await asyncio.gather(*(hasher.analyse("m", chat, "chat", 16) for chat in chats))
    assert renderer.tokenized_chars < 3 * len(system)   # not 100 times
    for chat, result in zip(chats, described):
        expected = qwen.chat_token_ids(chat)
        assert result.prompt_tokens == len(expected)
        assert list(result.block_hashes) == block_hashes(expected, 16, chain_seed("m", None))
    assert len(hasher._tokenizing) == 0


def test_tools_render_as_vllm_rebuilds_them(qwen: HFRenderer) -> None:
    """A tool without a description, its keys in another order, or with ``strict``:
    vLLM rebuilds it before the template writes it out (``description: null``, name,
    description, parameters in that order, ``strict`` only when set), so the gateway does
    (checked against vLLM's own /tokenize in the e2e stage)."""
    loose = {"messages": [{"role": "user", "content": "hi"}], "tools": [
        {"function": {"parameters": {"type": "object"}, "name": "f"}, "type": "function"},
        {"type": "function", "function": {"name": "g", "description": "G.", "strict": True,
                                          "parameters": None}}]}
    rendered = qwen.render_chat(loose)
    assert ('{"type": "function", "function": {"name": "f", "description": null, '
            '"parameters": {"type": "object"}}}') in rendered
    assert ('{"type": "function", "function": {"name": "g", "description": "G.", '
            '"parameters": null, "strict": true}}') in rendered
