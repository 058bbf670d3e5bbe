"""A request's ``add_special_tokens`` reaches the ids routing hashes, as it reaches vLLM's
(checked against vLLM 0.32 with a tokenizer that adds a BOS): a completions prompt sent
with it false has no BOS, a chat sent with it true gets one in front of the template's
text. A tokenizer that adds a BOS (Llama, Mistral, Gemma) otherwise shifts every block."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tokenizers import Tokenizer

from engine.tokenizer import HFRenderer
from gateway.prompt.render import PromptHasher

BOS = "<|endoftext|>"
CHAT = {"messages": [{"role": "system", "content": "Answer in French."},
                     {"role": "user", "content": "Where is the station?"}]}


def _with_bos(qwen_dir: str, tmp_path: Path) -> str:
    folder = tmp_path / "bos"
    shutil.copytree(qwen_dir, folder)
    spec = json.loads((folder / "tokenizer.json").read_text())
    bos_id = next(t["id"] for t in spec["added_tokens"] if t["content"] == BOS)
    spec["post_processor"] = {"type": "TemplateProcessing",
                              "single": [{"SpecialToken": {"id": BOS, "type_id": 0}},
                                         {"Sequence": {"id": "A", "type_id": 0}}],
                              "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
                              "special_tokens": {BOS: {"id": BOS, "ids": [bos_id],
                                                       "tokens": [BOS]}}}
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    return str(folder)


def test_the_flag_decides_the_bos_as_in_vllm(qwen_dir: str, tmp_path: Path) -> None:
    folder = _with_bos(qwen_dir, tmp_path)
    tokenizer = Tokenizer.from_file(folder + "/tokenizer.json")
    renderer = HFRenderer(folder)
    hasher = PromptHasher(renderer)
    text = "Timetables, fares and the rules for bicycles on board. " * 4
    assert hasher.token_ids("m", {"prompt": text}, "completions") == tokenizer.encode(text).ids
    assert hasher.token_ids("m", {"prompt": text, "add_special_tokens": False},
                            "completions") == tokenizer.encode(text, add_special_tokens=False).ids
    rendered = renderer.render_chat(CHAT)
    assert hasher.token_ids("m", CHAT, "chat") == tokenizer.encode(
        rendered, add_special_tokens=False).ids
    assert hasher.token_ids("m", {**CHAT, "add_special_tokens": True}, "chat") == \
        tokenizer.encode(rendered).ids
    with_bos = hasher.describe("m", {**CHAT, "add_special_tokens": True}, "chat", 4)
    assert set(with_bos.block_hashes).isdisjoint(hasher.describe("m", CHAT, "chat", 4).block_hashes)
