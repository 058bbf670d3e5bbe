"""What one request may cost routing, and what the memos may hold (gateway.prompt.bounds)."""

from __future__ import annotations

from typing import Any

import pytest

from engine.tokenizer import ByteRenderer, HFRenderer
from gateway.config import LimitSettings
from gateway.lint.template import ClockProbe, TemplateSource
from gateway.prompt.render import PromptHasher
from policies.lru import LRU

BLOCK = 16
NESTED_LOOPS = ("{% for i in range(8000) %}{% for j in range(8000) %}x{% endfor %}{% endfor %}"
                "{{ messages[0]['content'] }}")


def chat(content: str, **extra: object) -> dict:
    return {"messages": [{"role": "system", "content": "You are terse."},
                         {"role": "user", "content": content}], **extra}


def test_the_lru_evicts_the_oldest_until_its_bytes_fit() -> None:
    lru: LRU[str, int] = LRU(100, max_bytes=1000)
    for i in range(5):
        lru.put(f"k{i}", i, size=300)
    assert lru.bytes <= 1000 and len(lru) == 3
    assert "k0" not in lru and "k4" in lru
    assert lru.pop("k4") == 4 and lru.bytes == 600
    lru.clear()
    assert len(lru) == 0 and lru.bytes == 0 and lru.weight == 0


def test_a_huge_prompt_is_hashed_up_to_max_routed_tokens(qwen: HFRenderer) -> None:
    limits = LimitSettings(max_routed_tokens=512, max_routed_chars=8192)
    hasher = PromptHasher(qwen, limits)
    words = " ".join(f"w{i}" for i in range(400_000))  # ~2.8 MB, unique
    routed = hasher.describe("m", chat(words), "chat", BLOCK)
    assert routed.prompt_tokens == 512
    assert len(routed.block_hashes) == 512 // BLOCK
    assert hasher.truncated == 1
    # The bound keeps the leading text: a prompt that shares it routes alike.
    again = hasher.describe("m", chat(words + " and more"), "chat", BLOCK)
    assert again.block_hashes == routed.block_hashes
    # Nothing near the prompt's size was kept.
    assert sum(lru.bytes for lru in hasher.memos().values()) < len(words) // 5


def test_a_completions_prompt_is_cut_to_the_bounds() -> None:
    hasher = PromptHasher(ByteRenderer(), LimitSettings(max_routed_tokens=64,
                                                        max_routed_chars=100))
    text = hasher.describe("m", {"prompt": "y" * 100_000}, "completions", BLOCK)
    assert text.prompt_tokens == 25 and len(text.block_hashes) == 1  # 4 bytes a token
    ids = hasher.describe("m", {"prompt": list(range(10_000))}, "completions", BLOCK)
    assert ids.prompt_tokens == 64 and len(ids.block_hashes) == 64 // BLOCK
    assert hasher.truncated == 2


@pytest.mark.parametrize("prompt", [[-1], [4294967296], [[-5]], [1, 2.5], [True], [10**40],
                                    [1, "x"], [{"a": 1}]])
def test_token_ids_routing_cannot_hash_are_routed_by_load(prompt: list) -> None:
    hasher = PromptHasher(ByteRenderer())
    routed = hasher.describe("m", {"prompt": prompt}, "completions", BLOCK)
    assert routed.block_hashes == () and routed.prompt_tokens == 0
    assert hasher.fallbacks == {"token_ids": 1}


def test_a_client_template_is_never_rendered(qwen: HFRenderer) -> None:
    hasher = PromptHasher(qwen)
    hostile = hasher.describe("m", chat("hello", chat_template=NESTED_LOOPS), "chat", BLOCK)
    plain = PromptHasher(qwen).describe("m", chat("hello"), "chat", BLOCK)
    # Routed on the model's own template: the same blocks as without the template.
    assert hostile.block_hashes == plain.block_hashes and hostile.block_hashes
    assert hasher.fallbacks == {"client_template": 1}
    # The linter renders through the same renderer.
    assert "x" * 100 not in hasher.renderer.render_chat(chat("hi", chat_template=NESTED_LOOPS))


@pytest.mark.parametrize("renderer", ["bytes", "qwen"])
def test_deep_nesting_routes_by_load(renderer: str, qwen: HFRenderer) -> None:
    hasher = PromptHasher(ByteRenderer() if renderer == "bytes" else qwen)
    deep: object = "leaf"
    for _ in range(5000):
        deep = {"a": deep}
    tools = [{"type": "function", "function": {"name": "f", "parameters": deep}}]
    routed = hasher.describe("m", chat("hi", tools=tools), "chat", BLOCK)
    assert routed.block_hashes == ()
    calls = [{"role": "user", "content": "hi"},
             {"role": "assistant", "content": "", "tool_calls": [{"function": deep}]},
             {"role": "user", "content": "again"}]
    assert hasher.describe("m", {"messages": calls}, "chat", BLOCK).block_hashes == ()
    assert sum(hasher.fallbacks.values()) == 2


async def test_odd_types_never_raise() -> None:
    hasher = PromptHasher(ByteRenderer())
    bodies: list[dict[str, Any]] = [
        {"messages": "x"}, {"messages": [1, 2]}, {"messages": [{"role": 1}]},
        {"messages": [{"role": "user", "content": 5}]}, {"messages": []},
        chat("x", cache_salt=5), chat("x", chat_template_kwargs=[1]),
        chat("\ud800 lone surrogate"), chat("x", tools="t")]
    for body in bodies:
        await hasher.analyse("m", body, "chat", BLOCK)
    prompts: list[object] = [None, 5, {"a": 1}, [], [[]], ["x", 1]]
    for prompt in prompts:
        await hasher.analyse("m", {"prompt": prompt}, "completions", BLOCK)
    assert hasher.fallbacks["render"] >= 5


def test_every_memo_stays_within_its_bytes(qwen: HFRenderer) -> None:
    limits = LimitSettings(piece_memo_bytes=400_000, chain_memo_bytes=300_000,
                           turn_memo_bytes=100_000, reuse_marks_bytes=200_000,
                           template_memo_bytes=50_000)
    hasher = PromptHasher(qwen, limits)
    for i in range(300):
        history = [{"role": "user", "content": f"conversation {i} turn {t} " + "words " * 300}
                   for t in range(3)]
        messages = [m for turn in history for m in (turn, {"role": "assistant", "content": "ok"})]
        hasher.describe("m", {"messages": messages[:-1], "cache_salt": f"s{i % 50}"}, "chat",
                        BLOCK)
        hasher.run_pending()
    sizes = {name: lru.bytes for name, lru in hasher.memos().items()}
    for name, lru in hasher.memos().items():
        assert lru.max_bytes is not None and lru.bytes <= lru.max_bytes, (name, sizes)
    assert sizes["pieces"] > 300_000 and sizes["chain"] > 200_000  # they did fill up


def test_the_clock_probe_compiles_only_the_model_template_and_keeps_few() -> None:
    probe = ClockProbe(max_templates=2)
    for i in range(5):
        source = TemplateSource(f"{{{{ strftime_now('%Y') }}}} model {i}")
        assert probe.fills_clock(source, chat("x", chat_template=NESTED_LOOPS))
    assert len(probe.compiled) == 2


async def test_long_pieces_are_learned_off_the_loop_without_failing(
        qwen: HFRenderer, caplog: pytest.LogCaptureFixture) -> None:
    import asyncio

    hasher = PromptHasher(qwen)
    prompts = [f"document {i} " + " ".join(f"word{i}x{j}" for j in range(3000)) for i in range(12)]
    await asyncio.gather(*(hasher.analyse("m", chat(p), "chat", BLOCK) for p in prompts))
    while hasher._tasks:  # the learning scheduled after each request
        await asyncio.gather(*list(hasher._tasks))
    assert hasher.reuse is not None and len(hasher.reuse) > 12 * 100  # every piece's cuts
    assert "upkeep failed" not in caplog.text
    # and a piece that grows is tokenized from the known one
    grown = await hasher.analyse("m", chat(prompts[0] + " and a new question"), "chat", BLOCK)
    assert hasher.reuse.reuses == 1 and grown.block_hashes
