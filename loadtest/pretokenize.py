"""Micro-benchmark of ``HFRenderer.text_token_ids`` with and without ``engine.pretokenize``.

    python -m loadtest.pretokenize [tokenizer folder ...]

Prints µs per call (best of 5 rounds) for a ~700-character English text and a
~2,000-character code snippet: the Rust tokenizer's ``encode`` (before), and the fast
path with its word memo warm (after), and with every word new (the memo emptied before
each call: a text of words never seen). No assertions: numbers to read, not a test.
"""

from __future__ import annotations

import inspect
import sys
import time
from collections.abc import Callable

from engine import tokenizer as tokenizer_module
from engine.pretokenize import FastPretokenizer
from engine.tokenizer import HFRenderer, bundled_qwen_tokenizer_dir

ENGLISH = (
    "The quick brown fox jumps over the lazy dog. It's a well-known pangram, isn't it? "
    "Many people DON'T know that it contains every letter of the English alphabet at least "
    "once. In 2023, typists still used it to test keyboards, and designers used it to preview "
    "fonts.\n\nA prefix cache keeps the attention keys and values of prompts it has seen: "
    "when a new request starts with the same system prompt, the same documents or the same "
    "conversation, a replica skips recomputing them and answers sooner. Routing each request "
    "to the replica that already holds the longest part of its prompt is what a "
    "prefix-cache-aware gateway does; it must tokenize the prompt to know its blocks, and "
    "that costs CPU on every request.  Trailing spaces, too.  \n"
)

CODE_CHARS = 1964


def code_text() -> str:
    """~2,000 characters of real Python: the project's own chat rendering, from
    ``fold_content`` on (read, not copied here)."""
    source = inspect.getsource(tokenizer_module)
    start = source.index("def fold_content")
    return source[start:start + CODE_CHARS]


def per_call_us(fn: Callable[[], object], calls: int = 2000, rounds: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def main(folders: list[str]) -> None:
    for folder in folders:
        renderer = HFRenderer(folder)
        print(f"{renderer.name}: fast path {renderer.fast_pretokenize_reason}")
        for label, text in (("english", ENGLISH), ("code", code_text())):
            compare(renderer, label, text)


def cold_encode(fast: FastPretokenizer, text: str) -> list[int] | None:
    fast._memo.clear()
    return fast.encode(text)


def compare(renderer: HFRenderer, label: str, text: str) -> None:
    tokenizer = renderer._tokenizer
    before = per_call_us(lambda: tokenizer.encode(text, add_special_tokens=False).ids)
    after = per_call_us(lambda: renderer.text_token_ids(text, add_special_tokens=False))
    fast = renderer.pretokenizer
    cold = per_call_us(lambda: cold_encode(fast, text), calls=200) if fast else 0.0
    same = renderer.text_token_ids(text, False) == tokenizer.encode(
        text, add_special_tokens=False).ids
    print(f"  {label:8s} {len(text):5d} chars  before {before:7.1f} µs  "
          f"after {after:7.1f} µs  ({before / after:.1f}x, same ids: {same}); "
          f"every word new: {cold:.1f} µs")


if __name__ == "__main__":
    main(sys.argv[1:] or [str(bundled_qwen_tokenizer_dir())])
