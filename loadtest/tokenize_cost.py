"""Tokenizing new text: the Rust tokenizer against the Python fast path, and the loop.

    python -m loadtest.tokenize_cost [--repeat 20]

One process, the bundled Qwen3 tokenizer, texts cut from this repository's docs and
code (non-ASCII characters and added-token look-alikes blanked, so the fast path
takes them all):

* CPU per text at 4k-64k characters: the Rust tokenizer (``Tokenizer.encode``)
  against ``engine.pretokenize`` with its word memo emptied before every text (the
  cost of text never seen) and warm; both give the same ids, checked here;
* what a worker thread tokenizing 64k-character texts does to the event loop: a 1 ms
  ticker's lateness while the thread encodes in one go, in slices with the GIL given
  up between them (what the gateway does), and with the Rust tokenizer's
  ``encode_batch`` (which releases the GIL throughout).

Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time
from collections.abc import Callable
from pathlib import Path

from engine.tokenizer import HFRenderer, bundled_qwen_tokenizer_dir
from loadtest import markdown
from loadtest.summary import percentile
from loadtest.workloads.mooncake import repo_root

SIZES = (4096, 8192, 32768, 65536)


def corpus(added: list[str]) -> str:
    root = repo_root()
    files = sorted([*root.glob("docs/**/*.md"), *root.glob("gateway/**/*.py"),
                    *root.glob("engine/**/*.py")])
    text = "".join(Path(f).read_text(encoding="utf-8") for f in files)
    text = re.sub(r"[^\t\n\r\x20-\x7e]", " ", text)
    for token in sorted(added, key=len, reverse=True):  # <tool_call>, <|im_start|>, ...
        if len(token) > 1:
            text = text.replace(token, token[0] + " " + token[1:])
    return text


def texts(source: str, size: int, count: int) -> list[str]:
    count = min(count, len(source) // size)
    return [source[i * size:(i + 1) * size] for i in range(count)]


def per_text_ms(items: list[str], encode: Callable[[str], object],
                before: Callable[[], None] = lambda: None) -> float:
    total = 0.0
    for text in items:
        before()
        started = time.perf_counter()
        encode(text)
        total += time.perf_counter() - started
    return total / len(items) * 1000


def cpu_table(renderer: HFRenderer, source: str, repeat: int) -> str:
    fast = renderer.pretokenizer
    assert fast is not None, renderer.fast_pretokenize_reason
    rust = renderer._tokenizer
    rows = []
    for size in SIZES:
        items = texts(source, size, repeat)
        for text in items:
            assert fast.encode(text) == rust.encode(text, add_special_tokens=False).ids
        rust_ms = per_text_ms(items, lambda t: rust.encode(t, add_special_tokens=False))
        cold_ms = per_text_ms(items, fast.encode, fast._memo.clear)
        warm_ms = per_text_ms(items, fast.encode)
        rows.append([f"{size:,}", f"{rust_ms:.2f}", f"{cold_ms:.2f}", f"{warm_ms:.2f}",
                     f"{cold_ms / rust_ms:.2f}x"])
    return markdown.table(["characters", "Rust ms", "fast, memo empty ms", "fast, warm ms",
                           "fast (memo empty) / Rust"], rows)


async def loop_lag(encode: Callable[[str], object], items: list[str]) -> list[float]:
    """A 1 ms ticker's lateness (ms) while a worker thread encodes ``items``."""
    lags: list[float] = []
    done = False

    async def tick() -> None:
        while not done:
            started = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append((time.perf_counter() - started - 0.001) * 1000)

    ticker = asyncio.ensure_future(tick())
    for text in items:
        await asyncio.to_thread(encode, text)
    done = True
    await ticker
    return lags


def lag_table(renderer: HFRenderer, source: str, repeat: int) -> str:
    fast = renderer.pretokenizer
    assert fast is not None
    rust = renderer._tokenizer
    items = texts(source, 65536, repeat)

    def pause() -> None:
        time.sleep(0)

    ways: list[tuple[str, Callable[[str], object]]] = [
        ("fast path, one go", fast.encode),
        ("fast path, sliced (the gateway's)", lambda t: fast.encode(t, pause)),
        ("Rust encode_batch (GIL released)",
         lambda t: rust.encode_batch([t], add_special_tokens=False)),
    ]
    rows = []
    for name, encode in ways:
        lags = asyncio.run(loop_lag(encode, items))
        rows.append([name, markdown.num(percentile(lags, 50), 2),
                     markdown.num(percentile(lags, 99), 2), markdown.num(max(lags), 2)])
    return markdown.table(["worker thread encodes 64k characters", "loop lag p50 ms",
                           "p99 ms", "max ms"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=20, help="texts per size")
    args = parser.parse_args()
    folder = bundled_qwen_tokenizer_dir()
    if folder is None:
        raise SystemExit("the bundled Qwen3 tokenizer is not installed (the sim extra)")
    renderer = HFRenderer(folder)
    source = corpus(renderer.added_tokens())
    print(f"bundled Qwen3 tokenizer, {args.repeat} texts per size, "
          f"{len(source):,} characters of docs and code\n")
    print(cpu_table(renderer, source, args.repeat))
    print()
    print(lag_table(renderer, source, args.repeat))


if __name__ == "__main__":
    main()
