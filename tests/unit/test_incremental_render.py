"""Follow-ups in a known conversation are rendered from the last turn on, exactly."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from engine.tokenizer import HFRenderer
from gateway.prompt.render import PromptHasher
from policies.hashing import block_hashes, chain_seed

from ..chat_corpus import CHATS


def expected_hashes(renderer: HFRenderer, body: dict[str, Any], block_size: int,
                    model: str = "m") -> tuple[list[int], int]:
    """The tokenizer's own ids for the whole rendered prompt (one encode of it all)."""
    text = renderer.render_chat(body)
    ids = renderer._tokenizer.encode(text, add_special_tokens=False).ids
    return block_hashes(ids, block_size, chain_seed(model, body.get("cache_salt"))), len(ids)


def follow_ups(chat: dict[str, Any]) -> list[dict[str, Any]]:
    """The chat, then two more rounds of answer + question on top of it."""
    bodies = [chat]
    messages = list(chat["messages"])
    for turn in range(2):
        messages = messages + [{"role": "assistant", "content": f"Answer {turn}: 好的 " * 9},
                               {"role": "user", "content": f"Follow-up {turn}?  "}]
        bodies.append({**chat, "messages": messages})
    return bodies


@pytest.mark.parametrize("chat", CHATS, ids=range(len(CHATS)))
def test_follow_ups_hash_like_a_full_render(qwen: HFRenderer, chat: dict[str, Any]) -> None:
    hasher = PromptHasher(qwen)
    memo = hasher.conversations
    assert memo is not None and memo.enabled  # Qwen3's template is append-only
    for round_, body in enumerate(follow_ups(chat)):
        before = memo.incremental
        described = hasher.describe("m", body, "chat", 16)
        hashes, tokens = expected_hashes(qwen, body, 16)
        assert described.prompt_tokens == tokens
        assert list(described.block_hashes) == hashes
        if round_ and chat["messages"][-1]["role"] == "user":
            assert memo.incremental == before + 1, "the follow-up was rendered whole"
    assert hasher.run_audits() > 0
    assert memo.audit_failures == 0 and memo.enabled


def test_forty_turns_render_only_the_new_messages(qwen: HFRenderer) -> None:
    hasher = PromptHasher(qwen)
    calls: list[int] = []
    render = qwen.render_chat

    def counting(body: Any) -> str:
        calls.append(len(body["messages"]))
        return render(body)

    assert hasher.conversations is not None
    hasher.conversations._render = counting
    messages: list[dict[str, Any]] = [{"role": "system", "content": "rules " * 300}]
    for turn in range(20):
        messages += [{"role": "user", "content": f"question {turn} " * 20}]
        body = {"messages": list(messages), "cache_salt": "tenant"}
        calls.clear()
        described = hasher.describe("m", body, "chat", 32)
        assert list(described.block_hashes) == expected_hashes(qwen, body, 32)[0]
        if turn >= 2:
            # one render of the placeholder and the two new messages
            assert calls == [3], calls
        messages += [{"role": "assistant", "content": f"answer {turn} " * 15}]


def test_a_changed_earlier_message_is_not_taken_for_the_known_turn(qwen: HFRenderer) -> None:
    hasher = PromptHasher(qwen)
    first = {"messages": [{"role": "system", "content": "A"}, {"role": "user", "content": "q1"}]}
    hasher.describe("m", first, "chat", 16)
    edited = {"messages": [{"role": "system", "content": "B"}, {"role": "user", "content": "q1"},
                           {"role": "assistant", "content": "a1"},
                           {"role": "user", "content": "q2"}]}
    described = hasher.describe("m", edited, "chat", 16)
    assert list(described.block_hashes) == expected_hashes(qwen, edited, 16)[0]
    salted = {**edited, "messages": first["messages"] + edited["messages"][2:],
              "cache_salt": "other"}
    described = hasher.describe("m", salted, "chat", 16)
    assert list(described.block_hashes) == expected_hashes(qwen, salted, 16)[0]


NOT_APPEND_ONLY = (  # the system prompt goes last, next to the question
    "{%- for m in messages if m.role != 'system' %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "<|im_end|>\n{%- endfor %}"
    "{%- for m in messages if m.role == 'system' %}<|im_start|>system\n{{ m.content }}"
    "<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")


def test_a_template_that_is_not_append_only_is_rendered_whole(qwen_dir: str) -> None:
    renderer = HFRenderer(qwen_dir, chat_template=NOT_APPEND_ONLY)
    hasher = PromptHasher(renderer)
    assert hasher.conversations is not None and not hasher.conversations.enabled
    for body in follow_ups(CHATS[2]):
        described = hasher.describe("m", body, "chat", 16)
        assert list(described.block_hashes) == expected_hashes(renderer, body, 16)[0]
    assert hasher.conversations.incremental == 0


# Append-only on every short conversation, but numbers its turns from the
# ninth message on: only a full render of a long chat shows the difference.
LONG_CHATS_DIFFER = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{%- if messages|length > 8 and loop.index0 == 1 %}[long chat]{% endif %}{{ m.content }}"
    "<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")


def test_audit_turns_the_incremental_path_off_when_it_disagrees(
        qwen_dir: str, caplog: pytest.LogCaptureFixture) -> None:
    renderer = HFRenderer(qwen_dir, chat_template=LONG_CHATS_DIFFER)
    hasher = PromptHasher(renderer)
    memo = hasher.conversations
    assert memo is not None and memo.enabled  # the load-time samples cannot see it
    messages: list[dict[str, Any]] = [{"role": "user", "content": "q0"}]
    wrong = None
    with caplog.at_level(logging.WARNING, logger="prefixgate.prefix"):
        for turn in range(1, 8):
            body = {"messages": list(messages)}
            described = hasher.describe("m", body, "chat", 16)
            if list(described.block_hashes) != expected_hashes(renderer, body, 16)[0]:
                wrong = body
            hasher.run_audits()
            messages += [{"role": "assistant", "content": f"a{turn}"},
                         {"role": "user", "content": f"q{turn}"}]
    assert wrong is not None  # the incremental render did go wrong on a long chat ...
    assert memo.audit_failures >= 1 and not memo.enabled  # ... the audit caught it
    assert "disagreed with a full render" in caplog.text
    body = {"messages": list(messages)}
    described = hasher.describe("m", body, "chat", 16)  # ... and it is whole again
    assert list(described.block_hashes) == expected_hashes(renderer, body, 16)[0]


def test_a_message_that_grows_keeps_its_known_blocks(qwen: HFRenderer) -> None:
    """A new piece that extends a known one: the decision sees the shared blocks."""
    hasher = PromptHasher(qwen)
    first = {"messages": [{"role": "user", "content": "the story so far " * 120}]}
    hasher.describe("m", first, "chat", 16)
    grown = {"messages": [{"role": "user", "content": first["messages"][0]["content"]
                           + " and then something new happened " * 20}]}
    plan = hasher.plan("m", grown, "chat", 16)
    assert plan is not None and plan.missing  # the grown message is a piece never seen
    whole = hasher.finish(plan, hasher.tokenize_missing(plan))
    assert list(whole.block_hashes) == expected_hashes(qwen, grown, 16)[0]
    before = hasher.describe("m", first, "chat", 16).block_hashes
    shared = next((i for i, (a, b) in enumerate(zip(before, whole.block_hashes)) if a != b),
                  len(before))
    assert shared >= len(before) - 2  # all but the blocks at the old message's end
