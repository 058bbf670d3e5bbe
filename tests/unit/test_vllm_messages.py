"""Messages route as vLLM renders them, after what vLLM does to them first (vLLM 0.32's
``renderers/chat_utils.py`` and ``renderers/hf.py``; the e2e corpus checks the ids
against a real vLLM's /tokenize): ``developer`` messages as system messages merged into
one in front when the model's chat template does not name the role; only the keys vLLM
keeps; tool-call arguments as vLLM parses them."""

from __future__ import annotations

from typing import Any

from engine.content_format import content_format
from engine.tokenizer import HFRenderer, conversation
from gateway.prompt.bounds import ModelTemplate
from gateway.prompt.render import PromptHasher
from gateway.request.prompt_shapes import prompt_of

from ..chat_corpus import PARTS_TEMPLATE
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


def hashes(hasher: PromptHasher, messages: list[Any]) -> list[int]:
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


def call(arguments: str) -> dict[str, Any]:
    return {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}


def test_only_what_vllm_keeps_of_a_message_reaches_the_template(qwen: HFRenderer) -> None:
    asked = {"role": "user", "content": "Weather?"}
    result = {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
    thought = {"role": "assistant", "content": "", "tool_calls": [call('{"c": "x"}')]}
    hasher = PromptHasher(qwen)
    plain = hashes(hasher, [asked, thought, result])
    # vLLM's request model has no reasoning_content or thinking: the thought is not rendered
    for key in ("reasoning_content", "thinking"):
        assert hashes(hasher, [asked, {**thought, key: "Call f."}, result]) == plain
    # ... it reads reasoning, which Qwen3's template renders in the loop of calls
    reasoned = [asked, {**thought, "reasoning": "Call f."}, result]
    assert hashes(hasher, reasoned) != plain
    assert "<think>\nCall f.\n</think>" in qwen.render_chat({"messages": reasoned})
    echoed: dict[str, Any] = {"role": "assistant", "content": "Hi", "refusal": None, "annotations": [],
              "tool_calls": [], "metadata": {"a": 1}}
    assert conversation({"messages": [asked, echoed]})[1] == {"role": "assistant",
                                                              "content": "Hi"}


def test_tool_call_arguments_are_parsed_as_vllm_parses_them() -> None:
    def arguments(text: str) -> Any:
        messages = [{"role": "assistant", "content": None, "tool_calls": [call(text)]}]
        return conversation({"messages": messages})[0]["tool_calls"][0]["function"]["arguments"]

    assert arguments('{"c": "x"}') == {"c": "x"}
    for text in ("", "{c: x", "[1, 2]", "42", "null"):  # vLLM coerces these to {}
        assert arguments(text) == {}, text


PART_LOOPS = {  # a template, and the format vLLM 0.32 gives it (checked with its own code)
    "{% for m in messages %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endfor %}":
        "openai",
    "{% for m in messages if m.role != 'system' %}{% for p in m['content'] | list %}"
    "{{ p }}{% endfor %}{% endfor %}": "openai",
    "{% macro r(parts) %}{% for p in parts %}{{ p.text }}{% endfor %}{% endmacro %}"
    "{% for m in messages %}{{ r(m.content) }}{% endfor %}": "openai",
    "{% macro r(a, parts=none) %}{% for p in parts %}{{ p }}{% endfor %}{% endmacro %}"
    "{% for m in messages %}{{ r(1, parts=m['content']) }}{% endfor %}": "openai",
    "{% for m in messages %}{% set content = m.content %}{% for p in content %}{{ p }}"
    "{% endfor %}{% endfor %}": "openai",
    "{% for m in messages %}{{ m.content | trim }}{% endfor %}": "string",
    "{% macro r(xs) %}{% for x in xs %}{{ x }}{% endfor %}{% endmacro %}"
    "{% for m in messages %}{{ m.content }}{{ r(tools) }}{% endfor %}": "string",
    "{% for m in messages %}{{ m.content }{% endfor %}": "string",  # does not parse
    # a filter transformers does not define: the template does not compile
    "{% for m in messages %}{% for p in m.content | parts_of %}{{ p }}{% endfor %}"
    "{% endfor %}": "string",
}


def test_the_content_format_is_vllms() -> None:
    for template, expected in PART_LOOPS.items():
        assert content_format(template) == expected, template


def test_a_template_that_loops_over_parts_routes_on_the_parts(qwen_dir: str) -> None:
    renderer = HFRenderer(qwen_dir, chat_template=PARTS_TEMPLATE)
    chat = {"messages": [{"role": "system", "content": "  Be terse. \n"},
                         {"role": "user", "content": [{"type": "text", "text": " one "},
                                                      {"type": "text", "text": "two"}]}]}
    # vLLM hands it parts, which it trims: a string would keep its spaces and newlines
    assert renderer.render_chat(chat).startswith(
        "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nonetwo<|im_end|>")
    hasher = PromptHasher(renderer)
    trimmed = {"messages": [{"role": "system", "content": "Be terse."},
                            {"role": "user", "content": [{"type": "text", "text": "one"},
                                                         {"type": "text", "text": "two"}]}]}
    assert hashes(hasher, chat["messages"]) == hashes(hasher, trimmed["messages"])


REASONED = [{"role": "user", "content": [{"type": "thinking", "thinking": "They want brevity."},
                                          {"type": "text", "text": "Hi"}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "Greet."},
                                              {"type": "output_text", "text": "Hello."}]},
            {"role": "user", "content": [{"type": "tool_reference", "name": "search"}, "Look",
                                         {"type": "text", "text": None},
                                         {"type": "refusal", "refusal": None}]}]
"""Parts vLLM reads as text: a ``thinking`` part (its ``thinking``), a ``tool_reference``
(its tool's name), a bare string; a text or refusal part with no text is skipped."""


def test_thinking_and_tool_reference_parts_route_as_the_text_vllm_reads(qwen: HFRenderer) -> None:
    as_text = [{"role": "user", "content": "They want brevity.\nHi"},
               {"role": "assistant", "content": "Greet.\nHello."},
               {"role": "user", "content": "search\nLook"}]
    assert qwen.render_chat({"messages": REASONED}) == qwen.render_chat({"messages": as_text})
    hasher = PromptHasher(ModelTemplate(qwen))
    described = hasher.describe("m", {"messages": REASONED}, "chat", 4)
    assert list(described.block_hashes) == hashes(PromptHasher(qwen), as_text)


def test_a_parts_template_gets_thinking_as_a_text_part(qwen_dir: str) -> None:
    renderer = HFRenderer(qwen_dir, chat_template=PARTS_TEMPLATE)
    chat = {"messages": [{"role": "user", "content": [
        {"type": "thinking", "thinking": " t "}, {"type": "text", "text": None},
        {"type": "input_text", "text": " u "}]}]}
    assert renderer.render_chat(chat).startswith("<|im_start|>user\ntu<|im_end|>")


def test_the_template_gets_the_variables_vllm_hands_it(qwen: HFRenderer) -> None:
    """vLLM 0.32 (``build_chat_params``): the request's ``reasoning_effort`` and
    ``documents`` over its ``chat_template_kwargs``, ``enable_thinking`` false for
    ``"none"`` unless the client set it, and the request's own ``add_generation_prompt``
    whatever the kwargs say (checked against a real vLLM's prompt_logprobs)."""
    chat = {"messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": "Hi"}]}
    plain = qwen.render_chat(chat)
    closed = plain + "<think>\n\n</think>\n\n"  # Qwen3's template without thinking
    assert qwen.render_chat({**chat, "reasoning_effort": "none"}) == closed
    assert qwen.render_chat({**chat, "reasoning_effort": "low"}) == plain
    assert qwen.render_chat({**chat, "reasoning_effort": "none",
                             "chat_template_kwargs": {"enable_thinking": True}}) == plain
    assert qwen.render_chat({**chat, "chat_template_kwargs": {
        "add_generation_prompt": False}}) == plain
    hasher = PromptHasher(ModelTemplate(qwen))
    assert hashes(hasher, chat["messages"]) != list(hasher.describe(
        "m", {**chat, "reasoning_effort": "none"}, "chat", 4).block_hashes)


DOCUMENTS_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% for d in documents or [] %}[{{ d.title }}] {{ d.text }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_documents_reach_the_template(qwen_dir: str) -> None:
    renderer = HFRenderer(qwen_dir, chat_template=DOCUMENTS_TEMPLATE)
    chat = {"messages": [{"role": "user", "content": "Sum up."}]}
    docs = [{"title": "A", "text": "alpha"}]
    expected = "<|im_start|>user\nSum up.<|im_end|>\n[A] alpha\n<|im_start|>assistant\n"
    assert renderer.render_chat({**chat, "documents": docs}) == expected
    assert renderer.render_chat({**chat, "chat_template_kwargs": {"documents": docs}}) == expected


def test_responses_and_messages_efforts_render_as_vllm_renders_them(qwen: HFRenderer) -> None:
    closed = "<think>\n\n</think>\n\n"
    cases: list[tuple[str, dict[str, Any], bool]] = [
             ("responses", {"input": "Hi", "reasoning": {"effort": "none"}}, True),
             ("responses", {"input": "Hi", "reasoning": {"effort": "low"}}, False),
             ("messages", {"messages": [{"role": "user", "content": "Hi"}],
                           "thinking": {"type": "disabled"}}, True),
             ("messages", {"messages": [{"role": "user", "content": "Hi"}],
                           "output_config": {"effort": "high"}}, False)]
    for kind, body, without_thinking in cases:
        shaped = prompt_of(kind, body)
        assert shaped is not None
        assert qwen.render_chat(shaped[1]).endswith(closed) is without_thinking, body
