"""Other model families' chat templates (Llama 3 and 3.2, Mistral v0.3, Gemma 2 and 3, Phi-3,
DeepSeek-R1) rendered by the gateway and by transformers, as vLLM renders them: the same
text and token ids, the same refusals, and hashes of a growing chat that agree with a
full render (a mismatch would route every request to a replica that cannot hit).

The templates are in ``tests/fixtures/chat_templates/``, written for these tests in the
shape of each family's ``tokenizer_config.json`` template (what they read of a message,
the helpers they call: ``raise_exception``, ``strftime_now``, ``namespace``, ``tojson``,
``selectattr``, ``items()``, string methods, ``is defined`` checks of variables vLLM
passes or not). The tokenizer is the bundled Qwen3 one: what is under test is the
rendering, and the block hashes of what it renders.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from engine.content_format import content_format
from engine.tokenizer import HFRenderer, bundled_qwen_tokenizer_dir, conversation
from gateway.prompt.render import PromptHasher
from tests.support.transformers_reference import TransformersRenderer

from .test_chat_template_parity import REQUESTS, WEATHER, _rendered
from .test_incremental_render import expected_hashes, follow_ups

TEMPLATES = Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates"
FAMILIES = sorted(p.stem for p in TEMPLATES.glob("*.jinja"))
OPENAI_CONTENT = {"gemma3"}
"""Templates that loop over a message's content parts: vLLM hands them the parts."""

CALL9 = {"id": "abcDEF123", "type": "function",  # Mistral wants ids of 9 characters
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}
EXTRA: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": None, "tool_calls": [CALL9]},
                  {"role": "tool", "tool_call_id": "abcDEF123", "content": "{\"temp\": 21}"},
                  {"role": "assistant", "content": "21 degrees"},
                  {"role": "user", "content": "thanks"}], "tools": [WEATHER]},
    {"messages": [{"role": "system", "content": [{"type": "text", "text": "sys part"}]},
                  {"role": "user", "content": [{"type": "text", "text": "a"},
                                               {"type": "text", "text": "b"}]}]},
    {"messages": [{"role": "user", "content": "hi"},
                  {"role": "assistant", "content": "<think>plan</think>answer"},
                  {"role": "user", "content": "more"}]},
    {"messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER],
     "chat_template_kwargs": {"date_string": "01 Jan 2030", "tools_in_user_message": False}},
]
CHATS: list[dict[str, Any]] = [
    {"messages": [{"role": "system", "content": "You are the assistant of Acme. " * 12},
                  {"role": "user", "content": "Hello there, how are you?"}]},
    {"messages": [{"role": "user", "content": "Tell me about caching. " * 10}]},
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    qwen = Path(bundled_qwen_tokenizer_dir() or "")
    config = json.loads((qwen / "tokenizer_config.json").read_text())
    out = {}
    for family in FAMILIES:
        folder = tmp_path_factory.mktemp(family)
        shutil.copy(qwen / "tokenizer.json", folder / "tokenizer.json")
        (folder / "tokenizer_config.json").write_text(json.dumps({
            **config, "bos_token": "<|endoftext|>",
            "chat_template": (TEMPLATES / f"{family}.jinja").read_text()}))
        out[family] = folder
    return out


_RENDERERS: dict[Path, HFRenderer] = {}


def _renderer(folder: Path) -> HFRenderer:
    """One renderer a folder for both tests (loading the tokenizer is most of their time)."""
    if folder not in _RENDERERS:
        _RENDERERS[folder] = HFRenderer(str(folder))
    return _RENDERERS[folder]


class _Reference(TransformersRenderer):
    """transformers, handed the messages as vLLM hands them to this template."""

    def __init__(self, path: str, openai: bool) -> None:
        super().__init__(path)
        self.openai = openai

    def render_chat(self, request: Any) -> str:
        prompt = self.tokenizer.apply_chat_template(
            conversation(request, openai=self.openai), tools=request.get("tools") or None,
            add_generation_prompt=bool(request.get("add_generation_prompt",
                                                   not request.get("continue_final_message"))),
            continue_final_message=bool(request.get("continue_final_message", False)),
            tokenize=False, **dict(request.get("chat_template_kwargs") or {}))
        assert isinstance(prompt, str)
        return prompt


def test_the_families_are_all_here() -> None:
    assert {"llama3", "llama3_2", "mistral_v3", "gemma2", "gemma3", "phi3",
            "deepseek_r1"} <= set(FAMILIES)


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_renders_and_tokenizes_as_transformers_does(
        folders: dict[str, Path], family: str) -> None:
    template = (TEMPLATES / f"{family}.jinja").read_text()
    assert (content_format(template) == "openai") == (family in OPENAI_CONTENT)
    ours = _renderer(folders[family])
    theirs = _Reference(str(folders[family]), family in OPENAI_CONTENT)
    rendered = 0
    for index, request in enumerate(REQUESTS + EXTRA):
        if "chat_template" in request or len(json.dumps(request)) > 4000:
            continue  # a request's own template; the long one only costs time here
        expected, got = _rendered(theirs, request), _rendered(ours, request)
        if expected.startswith("<refused"):
            assert got.startswith("<refused"), (family, index, got[:200])
            continue
        assert got == expected, (family, index)
        ids = theirs.text_token_ids(expected, add_special_tokens=False)
        assert ours.chat_token_ids(request) == ids, (family, index)
        rendered += 1
    assert rendered >= 4, family


@pytest.mark.parametrize("family", FAMILIES)
def test_a_growing_chat_hashes_as_a_full_render_of_it(folders: dict[str, Path],
                                                      family: str) -> None:
    renderer = _renderer(folders[family])
    hasher = PromptHasher(renderer)
    for chat in CHATS:
        for body in follow_ups(chat):
            if family == "gemma2" and body["messages"][0]["role"] == "system":
                continue  # Gemma 2 refuses a system message
            hashes, tokens = expected_hashes(renderer, body, 16)
            described = hasher.describe("m", body, "chat", 16)
            assert (described.prompt_tokens, list(described.block_hashes)) == (tokens, hashes)
    memo = hasher.conversations
    assert memo is None or memo.audit_failures == 0
