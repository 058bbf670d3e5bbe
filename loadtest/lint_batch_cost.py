"""What ``prefixgate lint`` on many requests of one app costs, long differing middles aligned
exactly or with the junk heuristic (``gateway.lint.variance.EXACT_ATOMS``).

    python -m loadtest.lint_batch_cost [--requests 40] [--words 300,1200] [--rounds 3]

Two workloads of ``--requests`` chat requests each, words cut from this repository's
docs (deterministic: the same text on every machine and run):

* ``passage-N``: a retrieval app: fixed instructions, a passage of N words of its own
  in each request's system prompt, a fixed closing line;
* ``template``: one app's long system prompt (1,000 words) with a name, a tier, a date
  and one word in the middle that vary, the middle between the first and the last of
  them is most of the prompt.

Each round lints every workload once with long middles aligned exactly (the rule before:
``SequenceMatcher`` without its junk heuristic whatever the length) and once as now, in
alternating order, and checks that both find the same (the JSON report, byte for
byte). Prints seconds per batch (the median of the rounds) and the ratio as a Markdown
table. The linter is built once, with the bundled tokenizer, outside the timing.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.lint import variance
from gateway.lint.batch import BatchLinter
from gateway.lint.cli import build_linter
from gateway.lint.linter import Linter
from gateway.lint.variance import Atomizer

REPO = Path(__file__).resolve().parents[1]
NAMES = ["Ada Obi", "Ken Ito", "Maria Lopez", "Sven Larsen", "Omar Haddad", "Rosa Costa"]


def _words() -> list[str]:
    return re.findall(r"\S+", " ".join(p.read_text(encoding="utf-8")
                                       for p in sorted((REPO / "docs").glob("*.md"))))


def passage_requests(words: list[str], n: int, length: int) -> list[dict[str, Any]]:
    rnd = random.Random(length)
    out = []
    for i in range(n):
        start = rnd.randrange(len(words) - length)
        system = ("You are the support assistant of Northwind. Use the context below.\n"
                  "Context:\n" + " ".join(words[start:start + length])
                  + "\nAnswer in one sentence and cite the context.")
        out.append({"model": "m", "messages": [{"role": "system", "content": system},
                                               {"role": "user", "content": f"Question {i}?"}]})
    return out


def template_requests(words: list[str], n: int) -> list[dict[str, Any]]:
    body = " ".join(words[100:1100])
    out = []
    for i in range(n):
        system = (f"Customer: {NAMES[i % len(NAMES)]}.\n"
                  + body.replace(" replica ", " replica " if i % 2 else " server ", 1)
                  + f"\nTier: {('gold', 'silver', 'bronze')[i % 3]}. Today is 2026-12-0{i % 7 + 1}.")
        out.append({"model": "m", "messages": [{"role": "system", "content": system},
                                               {"role": "user", "content": "hi"}]})
    return out


def lint_seconds(linter: Linter, bodies: list[dict[str, Any]], exact: bool) -> tuple[float, str]:
    kept = variance.EXACT_ATOMS
    variance.EXACT_ATOMS = 1 << 30 if exact else kept
    try:
        started = time.perf_counter()
        report = BatchLinter(linter, Atomizer()).lint(bodies, 16)
        return time.perf_counter() - started, json.dumps(report.to_json(), sort_keys=True)
    finally:
        variance.EXACT_ATOMS = kept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.lint_batch_cost")
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--words", default="300,1200", help="passage lengths, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    words = _words()
    workloads: dict[str, list[dict[str, Any]]] = {
        f"passage-{n}": passage_requests(words, args.requests, int(n))
        for n in args.words.split(",")}
    workloads["template"] = template_requests(words, args.requests)
    linter = build_linter(None, None, 1796637600.0)  # 2026-12-07, any fixed day
    print(f"{args.requests} requests a batch, {args.rounds} rounds\n")
    print("| workload | exact s | now s | now / exact | same report |")
    print("|---|---|---|---|---|")
    for name, bodies in workloads.items():
        times: dict[bool, list[float]] = {True: [], False: []}
        reports: dict[bool, str] = {}
        for round_ in range(args.rounds):
            for exact in ((True, False) if round_ % 2 == 0 else (False, True)):
                seconds, reports[exact] = lint_seconds(linter, bodies, exact)
                times[exact].append(seconds)
        median: Callable[[list[float]], float] = statistics.median
        old, new = median(times[True]), median(times[False])
        print(f"| {name} | {old:.2f} | {new:.2f} | {new / old:.3f}x | "
              f"{'yes' if reports[True] == reports[False] else 'NO'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
