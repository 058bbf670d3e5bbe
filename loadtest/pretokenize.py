"""Micro-benchmark of ``HFRenderer.text_token_ids`` with and without ``engine.pretokenize``.

    python -m loadtest.pretokenize [tokenizer folder ...]

Prints µs per call (best of 5 rounds) for a ~700-character English text and a
~2,000-character code snippet: the Rust tokenizer's ``encode`` (before), and the fast
path with its word memo warm (after), and with every word new (the memo emptied before
each call: a text of words never seen). No assertions: numbers to read, not a test.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

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

CODE = '''import json
from collections.abc import Mapping, Sequence
from typing import Any


class RenderError(ValueError):
    """The request cannot be rendered (bad messages, template failure)."""


def fold_content(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, Mapping):
                kind = part.get("type")
                if kind in ("text", "input_text") and isinstance(part.get("text"), str):
                    texts.append(part["text"])
                else:
                    raise RenderError(f"unsupported content part type {kind!r}")
        return "\\n".join(texts)
    raise RenderError("message content must be a string or a list of parts")


def conversation(request: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RenderError("messages must be a non-empty list")
    out: list[dict[str, Any]] = []
    for message in messages:
        item = {k: v for k, v in message.items() if k != "content"}
        item["content"] = fold_content(message.get("content"))
        for i in range(len(item) - 1):
            if item.get("n", 0) >= 2 and i < 10:
                item["x"] = json.dumps({"a": [1, 2, 3], "b": None}, indent=2)
        out.append(item)
    return out


def token_counts(rows: Sequence[Mapping[str, Any]], limit: int = 4096) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:  # <-- one pass; "ids" may be missing
        ids = row.get("ids") or []
        if len(ids) > limit:
            continue
        counts[row["name"]] = counts.get(row["name"], 0) + len(ids)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
'''


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
        for label, text in (("english", ENGLISH), ("code", CODE)):
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
