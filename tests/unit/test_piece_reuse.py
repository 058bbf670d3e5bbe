"""A new piece that extends a known one is tokenized from the known piece's tokens, exactly."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.tokenizer import HFRenderer
from gateway.prompt.render import REUSE_AUDIT_EVERY, PromptHasher

STORY = ("The harbour master counted the boats twice each morning and wrote the tally in a "
         "green ledger.\n退款须在三十天内申请，运费不退。 Then he walked the pier. ")


def test_a_growing_message_reuses_its_known_tokens(qwen: HFRenderer) -> None:
    hasher = PromptHasher(qwen)
    text = STORY * 20
    for turn in range(6):
        body = {"messages": [{"role": "user", "content": text}]}
        routed = hasher.describe("m", body, "chat", 16)
        full = qwen.text_token_ids(qwen.render_chat(body), add_special_tokens=False)
        assert routed.prompt_tokens == len(full)
        hasher.run_pending()
        text += f"\n\nAnswer {turn}: forty-two boats.\n\nQuestion {turn + 1}: and the ledger? "
    assert hasher.reused_pieces >= 5  # every turn after the first
    assert hasher.reuse_audit_failures == 0 and hasher.reuse is not None


def test_a_document_with_a_new_question_reuses_the_document(qwen: HFRenderer) -> None:
    hasher = PromptHasher(qwen)
    document = STORY * 30
    for question in ("Is shipping refunded?", "How long do I have?", "Who counts the boats?"):
        prompt = f"{document}\n\nQuestion: {question}"
        routed = hasher.describe("m", {"prompt": prompt}, "completions", 16)
        assert routed.prompt_tokens == len(qwen.text_token_ids(prompt))
        hasher.run_pending()
    assert hasher.reused_pieces == 2


# -- tokenizers that break the assumptions ---------------------------------------------------

@dataclass
class CharEncoding:
    """One token per character: the offsets a ``tokenizers.Encoding`` gives."""

    size: int
    first: int = 0

    def char_to_token(self, char_pos: int) -> int | None:
        return char_pos + self.first if 0 <= char_pos < self.size else None

    def token_to_chars(self, token_index: int) -> tuple[int, int] | None:
        pos = token_index - self.first
        return (pos, pos + 1) if 0 <= pos < self.size else None


class CharRenderer:
    """A toy tokenizer: one id per character, shifted by ``bias(text)`` for the whole text."""

    name = "chars"
    units_per_token = 1

    def __init__(self, prepend: bool = False, loud_tail: bool = False) -> None:
        self.prepend = prepend  # SentencePiece-like: every call starts with a marker
        self.loud_tail = loud_tail  # every id depends on how the whole text ends

    def text_token_ids(self, text: str, add_special_tokens: bool = True) -> list[int]:
        bias = 100_000 if self.loud_tail and text.endswith("!") else 0
        return ([1] if self.prepend and text else []) + [ord(ch) + bias for ch in text]

    def encode_with_offsets(self, text: str) -> tuple[list[int], Any]:
        return self.text_token_ids(text), CharEncoding(len(text), 1 if self.prepend else 0)

    def render_chat(self, request: Mapping[str, Any]) -> str:
        raise NotImplementedError

    def chat_token_ids(self, request: Mapping[str, Any]) -> list[int]:
        raise NotImplementedError

    def as_vllm_reads(self, request: Mapping[str, Any]) -> Mapping[str, Any]:
        return request

    def decode(self, token_ids: Sequence[int]) -> str:
        return "".join(chr(t) for t in token_ids)


def test_a_tokenizer_that_marks_every_start_is_never_reused() -> None:
    renderer = CharRenderer(prepend=True)
    hasher = PromptHasher(renderer)
    text = "a b\n" * 600
    for extra in ("", " c d", " c d e f"):
        routed = hasher.describe("m", {"prompt": text + extra}, "completions", 16)
        assert routed.prompt_tokens == len(renderer.text_token_ids(text + extra))
        hasher.run_pending()
    assert hasher.reused_pieces == 0 and hasher.reuse is not None
    assert hasher.reuse.rejected > 0  # the verification caught it


def test_the_audit_switches_reuse_off_on_a_mismatch() -> None:
    renderer = CharRenderer(loud_tail=True)
    hasher = PromptHasher(renderer)
    text = "a b\n" * 600
    hasher.describe("m", {"prompt": text}, "completions", 16)
    hasher.run_pending()
    # The verification passes (the known piece re-tokenizes alike), but this
    # tokenizer's ids depend on the end of the whole text: only the audit sees it.
    hasher.describe("m", {"prompt": text + " wow!"}, "completions", 16)
    assert hasher.reused_pieces == 1 == REUSE_AUDIT_EVERY // REUSE_AUDIT_EVERY
    hasher.run_pending()
    assert hasher.reuse is None and hasher.reuse_audit_failures == 1
    again = hasher.describe("m", {"prompt": text + " wow wow!"}, "completions", 16)
    assert again.prompt_tokens == len(text) + 9  # full tokenization from now on
