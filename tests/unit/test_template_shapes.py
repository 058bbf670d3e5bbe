"""Chat renders filled from a shape's recipe (``engine.template_shapes``) are the very text
jinja2 renders, whatever the messages say and whatever the template does with them."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from engine import template_shapes as engine_template_shapes
from engine.chat_template import ChatTemplates
from engine.tokenizer import HFRenderer, bundled_qwen_tokenizer_dir
from tests.chat_corpus import PARTS_TEMPLATE

# Texts chosen to take every branch the templates below have, and to look like a
# stand-in: whitespace at the ends, the marker's letters, NUL, braces, quotes, tags.
TEXTS = ["hello", "", "   ", "  padded both ends \n", "/command arg", "line one\nline two",
         "has secret inside", "ends with a bang!", "<tool_response>\n{}\n</tool_response>",
         "<think>\nhmm\n</think>\n\nanswer", "qZxJ0 and qzxj1", "\x00 nul \t", 'quote " and \'',
         "{{ not a template }}", "日本語のテキスト", "x" * 300]

LLAMA_LIKE = (
    "{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + "
    "'<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}")
BRANCHING = (
    "{% for m in messages %}[{{ m.role }}]"
    "{% if m.content.startswith('/') %}CMD {% endif %}"
    "{% if 'secret' in m.content %}REDACTED{% else %}{{ m.content.lstrip() }}{% endif %}"
    "{% if not m.content %}(empty){% endif %}"
    "{% if m.content == 'hello' %}(greeting){% endif %}"
    "{{ m.content.rstrip('!') }}{% endfor %}")
BY_LENGTH = "{% for m in messages %}{% if m.content|length > 20 %}(long){% endif %}{% endfor %}"
"""A length is a guard too, but an exact one: a recipe serves only texts of that length."""
TWICE_OR_NEVER = (
    "{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}|{{ m.content }}"
    "{% endif %}{% endfor %}")
TRANSFORMING = [
    "{% for m in messages %}{{ m.content | upper }}{% endfor %}",
    "{% for m in messages %}{{ m.content | replace('\\n', ' ') }}{% endfor %}",
    "{% for m in messages %}{{ m.content.split('</think>')[-1] }}{% endfor %}",
    "{% for m in messages %}{{ m.content | tojson }}{% endfor %}",
    "{% for m in messages %}{{ m.content[:5] }}{% endfor %}",
    "{% for m in messages %}{{ (m.content ~ '') | trim }}{% endfor %}",
    "{% for m in messages %}{{ (m.content + '!') | trim }}{% endfor %}",
    "{% for m in messages %}{{ m.content | wordcount }}{% endfor %}",
    "{% for m in messages %}{{ '%-12s|' % m.content }}{% endfor %}",
    "{% for m in messages %}{{ m.content | indent(2) }}{% endfor %}",
    "{% for m in messages %}{{ m | tojson }}{% endfor %}",
    "{{ strftime_now('%Y') }}{% for m in messages %}{{ m.content }}{% endfor %}",
]
VARIABLES = {"bos_token": "<s>", "eos_token": "</s>"}


def conversation(texts: tuple[str, ...]) -> list[dict[str, Any]]:
    roles = ["system", "user", "assistant", "user"]
    return [{"role": roles[i % 4], "content": text} for i, text in enumerate(texts)]


def render(templates: ChatTemplates, template: str, messages: list[dict[str, Any]]) -> str:
    return templates.render(template, messages, tools=None, add_generation_prompt=True,
                            continue_final_message=False, variables=VARIABLES)


def pairs(count: int) -> list[tuple[str, ...]]:
    """Conversations of ``count`` messages covering every text in every place."""
    texts = TEXTS[:]
    return [tuple(texts[(i + k * 5) % len(texts)] for k in range(count))
            for i in range(len(texts))] + list(itertools.product(TEXTS[:4], repeat=count))[:20]


@pytest.mark.parametrize("template", [LLAMA_LIKE, BRANCHING, BY_LENGTH, TWICE_OR_NEVER,
                                      *TRANSFORMING])
def test_every_render_is_jinjas_own_text_whatever_the_messages_say(template: str) -> None:
    filled, whole = ChatTemplates(), ChatTemplates(fill=False)
    for texts in pairs(3):
        messages = conversation(texts)
        assert render(filled, template, messages) == render(whole, template, messages), texts
    assert filled.shapes is not None and filled.shapes.audit_failures == 0


@pytest.mark.parametrize("template", [LLAMA_LIKE, BRANCHING, TWICE_OR_NEVER])
def test_a_template_that_writes_the_text_out_or_tests_it_is_filled(template: str) -> None:
    templates, whole = ChatTemplates(), ChatTemplates(fill=False)
    for i in range(20):
        messages = conversation((f"You are bot {i}.", f"Question {i}?", f"Answer {i}."))
        assert render(templates, template, messages) == render(whole, template, messages)
    assert templates.shapes is not None
    assert templates.shapes.fills == 18  # all but the shape's first two (noted, then probed)


@pytest.mark.parametrize("template", TRANSFORMING)
def test_a_template_that_transforms_the_text_is_rendered_whole(template: str) -> None:
    templates = ChatTemplates()
    for texts in pairs(2):
        render(templates, template, conversation(texts))
    assert templates.shapes is not None and templates.shapes.fills == 0


def test_a_branch_the_recipe_cannot_see_is_caught_by_the_audit_and_filling_stops() -> None:
    # ``~`` makes a plain copy of the text; a test on the copy escapes the guards.
    template = ("{% for m in messages %}{% if ('x' ~ m.content).endswith('!') %}LOUD "
                "{% endif %}{{ m.content }}{% endfor %}")
    templates, whole = ChatTemplates(), ChatTemplates(fill=False)
    assert render(templates, template, conversation(("calm",))) == "calm"  # the shape noted
    assert render(templates, template, conversation(("still",))) == "still"  # the recipe
    loud = conversation(("hey!",))
    assert render(templates, template, loud) == render(whole, template, loud) == "LOUD hey!"
    shapes = templates.shapes
    assert shapes is not None and shapes.audit_failures == 1 and template in shapes.off
    fills = shapes.fills
    assert render(templates, template, conversation(("calm again",))) == "calm again"
    assert shapes.fills == fills  # rendered whole from now on


def test_after_its_first_uses_a_recipe_is_audited_one_in_audit_every() -> None:
    templates = ChatTemplates()
    shapes = templates.shapes
    assert shapes is not None
    shapes.audit_every = 8
    for i in range(66):
        render(templates, LLAMA_LIKE, conversation((f"system {i}", f"question {i}")))
    assert shapes.fills == 64
    assert shapes.audits == shapes.audit_first + 64 // 8 - 0  # fills 8, 16, ... 64 past the first 4


def test_shapes_differ_by_everything_but_the_text() -> None:
    templates, whole = ChatTemplates(), ChatTemplates(fill=False)
    template = ("{% for m in messages %}<{{ m.role }}{% if m.name is defined %} {{ m.name }}"
                "{% endif %}>{{ m.content }}{% endfor %}{% if tools %}{{ tools | tojson }}"
                "{% endif %}{{ flavour }}")
    variants: list[tuple[list[dict[str, Any]], Any, dict[str, Any]]] = [
        ([{"role": "user", "content": "a"}], None, {}),
        ([{"role": "user", "content": "b", "name": "ann"}], None, {}),
        ([{"role": "user", "content": "c", "name": "bob"}], None, {}),
        ([{"role": "system", "content": "d"}], None, {}),
        ([{"role": "user", "content": "e"}], [{"type": "function"}], {}),
        ([{"role": "user", "content": "f"}], None, {"flavour": "mint"}),
        ([{"role": "user", "content": "g"}], None, {"flavour": "lime"}),
        ([{"role": "user", "content": ["part"]}], None, {}),
    ]
    for _ in range(2):
        for messages, tools, extra in variants:
            got, want = (t.render(template, messages, tools=tools, add_generation_prompt=False,
                                  continue_final_message=False, variables=extra)
                         for t in (templates, whole))
            assert got == want


def test_qwen3_chats_are_filled_and_match_across_tool_and_thinking_turns() -> None:
    folder = bundled_qwen_tokenizer_dir()
    if folder is None:
        pytest.skip("the bundled Qwen3 tokenizer is not installed (the sim extra)")
    filled, whole = HFRenderer(folder), HFRenderer(folder)
    whole._sandbox.shapes = None  # every request through jinja2
    requests: list[dict[str, Any]] = []
    for text in TEXTS:
        requests.append({"messages": [{"role": "system", "content": "sys " + text},
                                      {"role": "user", "content": text}]})
        requests.append({"messages": [{"role": "user", "content": "q"},
                                      {"role": "assistant", "content": text},
                                      {"role": "user", "content": text}]})
        requests.append({"messages": [{"role": "user", "content": text},
                                      {"role": "assistant", "content": text}],
                         "add_generation_prompt": False})
        requests.append({"messages": [{"role": "user", "content": "q"},
                                      {"role": "tool", "content": text}],
                         "chat_template_kwargs": {"enable_thinking": False}})
    for request in requests * 2:
        assert filled.render_chat(request) == whole.render_chat(request), request
    shapes = filled.template_shapes
    assert shapes is not None and shapes.audit_failures == 0
    assert shapes.fills >= len(requests)


def test_a_shape_seen_once_is_never_probed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tool-call ids make most agent conversations a shape of their own: each is noted,
    rendered once, and costs no stand-in render."""
    templates = ChatTemplates()
    shapes = templates.shapes
    assert shapes is not None
    template = "{% for m in messages %}{{ m.tool_call_id }}:{{ m.content }}{% endfor %}"
    probes: list[int] = []
    real = engine_template_shapes._probe

    def counting(*args: Any) -> Any:
        probes.append(1)
        return real(*args)

    monkeypatch.setattr(engine_template_shapes, "_probe", counting)
    for i in range(20):
        render(templates, template, [{"role": "tool", "tool_call_id": f"call_{i}",
                                      "content": f"result {i}"}])
    assert not probes and shapes.fills == 0
    render(templates, template, [{"role": "tool", "tool_call_id": "call_3",
                                  "content": "another result"}])
    assert len(probes) == 1


def test_a_template_given_text_parts_is_filled_too() -> None:
    """vLLM's "openai" content format (engine.content_format): each part's text is a hole."""
    folder = bundled_qwen_tokenizer_dir()
    if folder is None:
        pytest.skip("the bundled Qwen3 tokenizer is not installed (the sim extra)")
    filled, whole = (HFRenderer(folder, chat_template=PARTS_TEMPLATE) for _ in range(2))
    whole._sandbox.shapes = None
    requests: list[dict[str, Any]] = []
    for text in TEXTS:
        requests.append({"messages": [{"role": "system", "content": "sys " + text},
                                      {"role": "user", "content": text}]})
        requests.append({"messages": [{"role": "user", "content": [
            {"type": "text", "text": text}, {"type": "text", "text": text + " more"}]}]})
    for request in requests * 2:
        assert filled.render_chat(request) == whole.render_chat(request), request
    shapes = filled.template_shapes
    assert shapes is not None and shapes.audit_failures == 0
    assert shapes.fills >= len(requests)
