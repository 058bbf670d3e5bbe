"""transformers itself, as vLLM's OpenAI server uses it: the reference the gateway's own
renderer (``engine.tokenizer.HFRenderer``, without transformers) is held to."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from transformers import AutoTokenizer  # the test extra's, never the gateway's

from engine.tokenizer import conversation


class TransformersRenderer:
    """``AutoTokenizer`` on a folder: ``apply_chat_template``, ``encode``, ``decode``."""

    def __init__(self, path: str) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)

    def render_chat(self, request: Mapping[str, Any]) -> str:
        continue_final = bool(request.get("continue_final_message", False))
        prompt = self.tokenizer.apply_chat_template(
            conversation(request), tools=request.get("tools") or None,
            chat_template=request.get("chat_template"),
            add_generation_prompt=bool(request.get("add_generation_prompt", not continue_final)),
            continue_final_message=continue_final, tokenize=False,
            **dict(request.get("chat_template_kwargs") or {}))
        assert isinstance(prompt, str)
        return prompt

    def text_token_ids(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(token_ids)))

    def added_tokens(self) -> list[str]:
        return [token.content for token in self.tokenizer.added_tokens_decoder.values()]
