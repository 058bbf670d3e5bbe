"""``developer`` messages route as vLLM renders them: as system messages, merged into one
in front, when the model's chat template does not name the role (vLLM 0.32's
``renderers/hf.py``; the e2e corpus checks the ids against a real vLLM's /tokenize)."""

from __future__ import annotations

from typing import Any

from engine.tokenizer import HFRenderer
from gateway.prompt.bounds import ModelTemplate
from gateway.prompt.render import PromptHasher

from .test_incremental_render import expected_hashes

AGENT = [{"role": "system", "content": "You are a coding agent."},
         {"role": "user", "content": "Fix the failing test."},
         {"role": "assistant", "content": "Looking at it."},
         {"role": "developer", "content": [{"type": "input_text", "text": "cwd: /repo"},
                                           {"type": "text", "text": "shell: bash"}]},
         {"role": "user", "content": "Go on."}]

AS_VLLM_BUILDS_IT = [{"role": "system",
                      "content": "You are a coding agent.\n\ncwd: /repo\nshell: bash"},
                     *AGENT[1:3], AGENT[4]]


def hashes(hasher: PromptHasher, messages: list[dict[str, Any]]) -> list[int]:
    return list(hasher.describe("m", {"messages": messages}, "chat", 4).block_hashes)


def test_a_late_developer_message_routes_as_part_of_the_system_prompt(qwen: HFRenderer) -> None:
    # Qwen3's template has no developer role: vLLM renders the system prompt with it
    hasher = PromptHasher(ModelTemplate(qwen))
    assert hashes(hasher, AGENT) == hashes(PromptHasher(qwen), AS_VLLM_BUILDS_IT)
    assert qwen.render_chat({"messages": AGENT}).startswith(
        "<|im_start|>system\nYou are a coding agent.\n\ncwd: /repo\nshell: bash<|im_end|>\n"
        "<|im_start|>user\nFix the failing test.")
    only = [{"role": "developer", "content": "Be brief."},
            {"role": "user", "content": "Hi"}]
    assert qwen.render_chat({"messages": only}).startswith("<|im_start|>system\nBe brief.")


def test_follow_ups_with_developer_messages_hash_like_a_full_render(qwen: HFRenderer) -> None:
    hasher = PromptHasher(qwen)
    memo = hasher.conversations
    assert memo is not None and memo.enabled
    messages: list[dict[str, Any]] = [{"role": "developer", "content": "Rules."}]
    for turn in range(4):
        messages += [{"role": "user", "content": f"question {turn}"}]
        body = {"messages": list(messages)}
        assert list(hasher.describe("m", body, "chat", 4).block_hashes) == (
            expected_hashes(qwen, body, 4)[0])
        messages += [{"role": "assistant", "content": f"answer {turn}"}]
        if turn == 1:  # an agent adds context mid-conversation
            messages += [{"role": "developer", "content": "The user is on a phone."}]
    assert memo.incremental >= 1  # turns without a new developer message stayed incremental
    hasher.run_audits()
    assert memo.audit_failures == 0 and memo.enabled


NAMES_DEVELOPER = (
    "{%- for m in messages %}<|im_start|>{{ 'developer' if m.role == 'developer' else m.role }}"
    "\n{{ m.content }}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")


def test_a_template_that_names_the_developer_role_gets_it(qwen_dir: str) -> None:
    renderer = HFRenderer(qwen_dir, chat_template=NAMES_DEVELOPER)
    text = renderer.render_chat({"messages": AGENT})
    assert "<|im_start|>developer\ncwd: /repo\nshell: bash<|im_end|>" in text
    assert text.startswith("<|im_start|>system\nYou are a coding agent.<|im_end|>")
