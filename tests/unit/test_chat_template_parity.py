"""The gateway's renderer (``tokenizers`` + ``engine.chat_template``) against transformers,
which vLLM renders with: the same prompt text, token ids and decoded text, request by
request, for every tokenizer folder at hand.

The folders: the bundled Qwen3 tokenizer (the ``sim`` extra), the vLLM-on-CPU setup's models
when ``deploy/vllm-cpu/setup.sh`` has run, and variants of Qwen3's folder built here for
what transformers reads besides ``tokenizer.json``: named templates, a ``chat_template.jinja``
file, a special token the tokenizer file lacks, ``split_special_tokens``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import jinja2
import pytest

from engine.tokenizer import HFRenderer, RenderError, bundled_qwen_tokenizer_dir
from tests.support.transformers_reference import TransformersRenderer

MODELS = Path.home() / ".cache" / "prefixgate" / "models"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}

REQUESTS: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "hello"}]},
    {"messages": [{"role": "system", "content": "You are terse."},
                  {"role": "user", "content": "What is 2+2?"},
                  {"role": "assistant", "content": "4"},
                  {"role": "user", "content": "And 3+3?"}]},
    {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": False},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "part one"},
                                                {"type": "text", "text": "part two"}]}]},
    {"messages": [{"role": "system", "content": "Use tools."},
                  {"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": None, "tool_calls": [CALL]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"}],
     "tools": [WEATHER]},
    {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER]},
    {"messages": [{"role": "user", "content": "think"},
                  {"role": "assistant", "content": "done", "reasoning_content": "hmm"},
                  {"role": "user", "content": "again"}]},
    {"messages": [{"role": "user", "content": "think"},
                  {"role": "assistant", "content": "done", "reasoning": "old name"},
                  {"role": "user", "content": "again"}]},
    {"messages": [{"role": "user", "content": "Write a haiku"},
                  {"role": "assistant", "content": "Autumn moonlight"}],
     "continue_final_message": True, "add_generation_prompt": False},
    {"messages": [{"role": "user", "content": "no thinking"}],
     "chat_template_kwargs": {"enable_thinking": False}},
    {"messages": [{"role": "user", "content": "  leading spaces\n\n\ttabs and 中文，日本語です 🎉"}]},
    {"messages": [{"role": "user", "content": "text with <|im_start|> and <|endoftext|> inside"}]},
    {"messages": [{"role": "user", "content": "named", "name": "alice"}]},
    {"messages": [{"role": "user", "content": "own template"}],
     "chat_template": "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"},
    {"messages": [{"role": "user", "content": "lorem ipsum dolor sit amet " * 400}]},
    {"messages": [{"role": "user", "content": "Weather?"},
                  {"role": "assistant", "content": "", "reasoning_content": "need a tool",
                   "tool_calls": [CALL]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
     "tools": [WEATHER]},
    {"messages": [{"role": "user", "content": "Weather?"},
                  {"role": "assistant", "content": "", "reasoning": "older name",
                   "tool_calls": [CALL]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
     "tools": [WEATHER]},
    # Templates that show what a template is given: each message as it arrives (nulls
    # dropped, reasoning aliased, key order), the variables, the sandbox's helpers.
    {"messages": [{"role": "user", "content": "hi", "name": None},
                  {"role": "assistant", "content": None, "tool_calls": [CALL],
                   "reasoning": "r"}],
     "chat_template": "{% for m in messages %}{{ m | tojson }}\n{% endfor %}"},
    {"messages": [{"role": "user", "content": "vars"}], "tools": [WEATHER],
     "chat_template": "{{ bos_token }}|{{ eos_token }}|{{ pad_token }}|{{ unk_token }}|"
                      "{{ tools | tojson(indent=2) }}|{{ add_generation_prompt }}|"
                      "{{ documents }}|{{ strftime_now('%Y') }}|{{ custom }}",
     "chat_template_kwargs": {"custom": "<b>&</b>"}},
    {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
     "chat_template": "{% set ns = namespace(n=0) %}{% for m in messages %}"
                      "{% if loop.index > 5 %}{% break %}{% endif %}{% set ns.n = ns.n + 1 %}"
                      "{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}"
                      "{{ ns.n }}{{ dict(a=1) | tojson }}"},
    {"messages": [{"role": "user", "content": "x"}],
     "chat_template": "{{ raise_exception('no') }}"},
    {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
     "continue_final_message": True, "add_generation_prompt": True},
]
TEXTS = ["hello world", " leading space", "中文 and English, 123.45!", "<|im_start|>user",
         "don't stop . , ? ! it's", "x" * 5000]


def _folders(tmp: Path) -> list[Path]:
    bundled = bundled_qwen_tokenizer_dir()
    assert bundled, "the sim extra's bundled tokenizer is part of the test install"
    folders = [Path(bundled)]
    folders += [p for p in sorted(MODELS.glob("*")) if (p / "tokenizer.json").is_file()]
    folders += _variants(Path(bundled), tmp)
    return folders


def _variants(qwen: Path, tmp: Path) -> list[Path]:
    config = json.loads((qwen / "tokenizer_config.json").read_text())
    template = config["chat_template"]
    out = []

    def variant(name: str, **changes: Any) -> Path:
        folder = tmp / name
        folder.mkdir()
        shutil.copy(qwen / "tokenizer.json", folder / "tokenizer.json")
        (folder / "tokenizer_config.json").write_text(json.dumps({**config, **changes}))
        out.append(folder)
        return folder

    named = variant("named", chat_template=[
        {"name": "default", "template": template},
        {"name": "tool_use", "template": "TOOLS {{ tools | tojson }}\n" + template}])
    assert named
    files = variant("files", chat_template=None)
    (files / "chat_template.jinja").write_text(template)
    (files / "additional_chat_templates").mkdir()
    (files / "additional_chat_templates" / "tool_use.jinja").write_text(
        "{{ bos_token }}T {{ tools | length }}\n" + template)
    variant("extra_token", additional_special_tokens=["<|im_start|>", "<|brand_new|>"],
            bos_token="<|brand_new|>",
            chat_template="{{ bos_token }}" + template)
    variant("split_specials", split_special_tokens=True)
    return out


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, HFRenderer,
                                                                   TransformersRenderer]]:
    tmp = tmp_path_factory.mktemp("tokenizers")
    return [(folder.name, HFRenderer(str(folder)), TransformersRenderer(str(folder)))
            for folder in _folders(tmp)]


def _rendered(renderer: HFRenderer | TransformersRenderer, request: dict[str, Any]) -> str:
    try:
        return renderer.render_chat(request)
    except (RenderError, ValueError, TypeError, jinja2.TemplateError) as exc:  # both refuse
        return f"<refused: {type(exc).__name__}>"


def test_prompts_token_ids_and_text_are_transformers_own(
        pairs: list[tuple[str, HFRenderer, TransformersRenderer]]) -> None:
    assert len(pairs) >= 5
    for name, ours, theirs in pairs:
        assert ours.added_tokens() == theirs.added_tokens(), name
        for index, request in enumerate(REQUESTS):
            expected = _rendered(theirs, request)
            got = _rendered(ours, request)
            if expected.startswith("<refused"):
                assert got.startswith("<refused"), (name, index, got[:200])
                continue
            assert got == expected, (name, index)
            ids = theirs.text_token_ids(expected, add_special_tokens=False)
            assert ours.chat_token_ids(request) == ids, (name, index)
            assert ours.decode(ids) == theirs.decode(ids), (name, index)
        for text in TEXTS:
            for special in (False, True):
                assert ours.text_token_ids(text, special) == theirs.text_token_ids(
                    text, special), (name, text[:40], special)
            ids = theirs.text_token_ids(text)
            assert ours.decode(ids) == theirs.decode(ids), (name, text[:40])


def test_per_request_templates_do_not_grow_the_compiled_cache() -> None:
    from engine.chat_template import ChatTemplates

    templates = ChatTemplates()
    for i in range(ChatTemplates.MAX_COMPILED * 3):
        text = f"{{% for m in messages %}}{i}:{{{{ m['content'] }}}}{{% endfor %}}"
        assert templates.render(text, [{"role": "user", "content": "hi"}], tools=None,
                                add_generation_prompt=False, continue_final_message=False,
                                variables={}) == f"{i}:hi"
    assert len(templates._compiled) == ChatTemplates.MAX_COMPILED


def test_continuing_a_final_message_leaves_the_callers_parts_as_sent() -> None:
    from engine.chat_template import ChatTemplates

    parts = [{"type": "text", "text": "Once upon"}]
    chat: list[dict[str, Any]] = [{"role": "user", "content": "tell"},
                                  {"role": "assistant", "content": parts}]
    text = ("{% for m in messages %}<{{ m['role'] }}>{% for p in m['content'] %}"
            "{{ p['text'] if p is mapping else p }}{% endfor %}</{{ m['role'] }}>{% endfor %}")
    rendered = ChatTemplates().render(text, chat, tools=None, add_generation_prompt=False,
                                      continue_final_message=True, variables={})
    assert rendered.endswith("<assistant>Once upon")
    assert parts == [{"type": "text", "text": "Once upon"}]


def test_a_template_cannot_store_underscore_names() -> None:
    """The one place the gateway's sandbox is stricter than vLLM 0.32's transformers
    (5.19; later versions refuse it too): templates run in the gateway's own process."""
    folder = bundled_qwen_tokenizer_dir()
    assert folder
    with pytest.raises(RenderError, match="underscore"):
        HFRenderer(folder).render_chat({
            "messages": [{"role": "user", "content": "x"}],
            "chat_template": "{% set ns = namespace(_private=1) %}{{ ns }}"})
