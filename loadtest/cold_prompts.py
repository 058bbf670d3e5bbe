"""``python -m loadtest cold-prompts``: what each router adds to a new prompt's first token.

A request whose system prompt no router has seen is the one a prefix-aware router
works hardest on (render, tokenize every piece, hash, place) and the one whose TTFT
a run's tail is made of: the first requests of every new app arrive cold. Here one
simulated replica (its real latency model: ``--time-scale 1``) sits behind every
path, and requests go one at a time, so nothing queues and what is measured is the
path's own work on a cold prompt:

* each step sends one request through every path (direct, the ``--policy``
  gateways, the ``--peers``), in an order shifted by one each step, each path with a
  system prompt of its own that nobody has seen (``--system-len`` words, each one
  token, and a ``--question-len`` question), so every path gets a cold prompt of the
  same length;
* a path's added TTFT is its TTFT less the direct request's of the same step (the
  replica's own time for a prompt that long), and the report gives its median, p90
  and mean over the steps, and each path's median as a ratio to every peer's.

``--warm``: the same system prompt for every step of a path (its first step not
counted): what a path adds to a prompt it has seen, with the replica's cache warm.
``--null-proxy`` adds a pass-through proxy on the gateway's server stack
(``loadtest/null_proxy.py``): what the extra hop alone adds in Python.

The first step of every path is a warm-up (discarded): a fresh process's first
request pays for its imports and connections, on every path.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from loadtest import markdown
from loadtest.contenders import ContenderSpec, ContenderUnavailable, launch
from loadtest.machine import machine_info
from loadtest.overhead import NULL_PROXY, parse_peers, round_order, start_null_proxy
from loadtest.processes import ServiceGroup
from loadtest.sims import SimFleetSpec, start_sims
from loadtest.summary import percentile
from loadtest.workloads.mooncake import repo_root
from loadtest.workloads.text import words

DIRECT = "direct"


def add_parser(commands: Any) -> None:
    p = commands.add_parser("cold-prompts", help="what each router adds to a new prompt's TTFT")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--policy", default="default",
                   help="prefixgate policies (comma-separated; POLICY?@tree=DIR runs another "
                        "checkout)")
    p.add_argument("--peers", default="", metavar="LIST",
                   help="peer routers, e.g. sglang-router:cache_aware")
    p.add_argument("--steps", type=int, default=40, help="requests per path, after a warm-up")
    p.add_argument("--system-len", type=int, default=1024)
    p.add_argument("--question-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=8)
    p.add_argument("--warm", action="store_true",
                   help="one system prompt per path: a prompt each path has seen")
    p.add_argument("--sim-args", default="", help="extra flags for the replica")
    p.add_argument("--null-proxy", action="store_true",
                   help="also a pass-through proxy on the gateway's server stack "
                        "(loadtest/null_proxy.py): what the extra hop alone adds")


def body(model: str, path: str, step: int, args: argparse.Namespace) -> dict[str, Any]:
    system = words(f"cold-prompts/{path}/" + ("warm" if args.warm else str(step)),
                   args.system_len)
    question = words(f"cold-prompts/{path}/question/{step}", args.question_len)
    return {"model": model, "stream": True, "max_tokens": args.output_len,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": question}]}


async def ttft(client: httpx.AsyncClient, url: str, payload: dict[str, Any]) -> float:
    """Seconds from sending to the first byte of the answer's body; the rest is read."""
    started = time.perf_counter()
    first: float | None = None
    async with client.stream("POST", url + "/v1/chat/completions", json=payload) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{url}: status {response.status_code}")
        async for _ in response.aiter_raw():
            if first is None:
                first = time.perf_counter()
    if first is None:
        raise RuntimeError(f"{url}: an empty answer")
    return first - started


async def drive(urls: dict[str, str], model: str,
                args: argparse.Namespace) -> dict[str, list[float]]:
    """Each path's TTFT per measured step (the warm-up step left out)."""
    measured: dict[str, list[float]] = {name: [] for name in urls}
    async with httpx.AsyncClient(timeout=120.0) as client:
        for step in range(args.steps + 1):
            for name in round_order(list(urls), step, rotate=True):
                seconds = await ttft(client, urls[name], body(model, name, step, args))
                if step > 0:
                    measured[name].append(seconds)
            print(f"step {step}/{args.steps}", file=sys.stderr, flush=True)
    return measured


def figures(measured: dict[str, list[float]]) -> dict[str, dict[str, float | None]]:
    """Per path: TTFT median, and added TTFT (less direct's, step by step) median/p90/mean."""
    direct = measured[DIRECT]
    out: dict[str, dict[str, float | None]] = {}
    for name, values in measured.items():
        added = [value - base for value, base in zip(values, direct, strict=True)]
        out[name] = {"ttft_p50": percentile(values, 50),
                     "added_p50": None if name == DIRECT else percentile(added, 50),
                     "added_p90": None if name == DIRECT else percentile(added, 90),
                     "added_mean": None if name == DIRECT else statistics.fmean(added)}
    return out


def report(paths: dict[str, dict[str, float | None]], peers: Sequence[str],
           args: argparse.Namespace, argv: Sequence[str]) -> str:
    rows = []
    for name, f in paths.items():
        ratios = []
        for peer in peers:
            mine, theirs = f["added_p50"], paths[peer]["added_p50"]
            if name == peer or mine is None or theirs is None or theirs <= 0:
                continue
            ratios.append(f"{mine / theirs:.2f}x {peer}")
        rows.append([name, markdown.ms(f["ttft_p50"], 2), markdown.ms(f["added_p50"], 2),
                     markdown.ms(f["added_p90"], 2), markdown.ms(f["added_mean"], 2),
                     ", ".join(ratios) or "-"])
    shape = "seen before (--warm)" if args.warm else "never seen"
    return "\n".join([
        (f"One replica, requests one at a time, a system prompt {shape} of "
         f"{args.system_len} words (one token each) and a {args.question_len}-word question, "
         f"{args.steps} steps (a warm-up step left out), every path in each step, the order "
         "shifted each step. Added: the path's TTFT less direct's in the same step."),
        "",
        f"Command: `python -m loadtest {' '.join(argv)}`",
        "",
        markdown.table(["path", "TTFT p50 ms", "added p50 ms", "added p90 ms", "added mean ms",
                        "added p50 vs peers"], rows),
    ])


def cold_prompts_command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    out: Path = args.out
    log_dir = out / "logs"
    gateways = [ContenderSpec("prefixgate", p.strip()) for p in args.policy.split(",")
                if p.strip()]
    peers = parse_peers(args.peers)
    fleet = SimFleetSpec(count=1, num_blocks=4096, time_scale=1.0,
                         max_model_len=8 * (args.system_len + args.question_len + 256),
                         extra_args=tuple(args.sim_args.split()),
                         kv_events=any(s.needs_kv_events() for s in (*gateways, *peers)))
    with ServiceGroup() as group:
        replicas = start_sims(fleet, group, log_dir)
        urls = {DIRECT: replicas[0].url}
        if args.null_proxy:
            urls[NULL_PROXY] = start_null_proxy(replicas[0].url, group, log_dir)
        for spec in (*gateways, *peers):
            try:
                urls[spec.name] = launch(spec, replicas, fleet.model, fleet.tokenizer_path(),
                                         group, log_dir)
            except ContenderUnavailable as exc:
                print(f"{spec.name} unavailable: {exc}", file=sys.stderr, flush=True)
        measured = asyncio.run(drive(urls, fleet.model, args))
    paths = figures(measured)
    peer_names = [s.name for s in peers if s.name in urls]
    out.mkdir(parents=True, exist_ok=True)
    markdown.write(out / "results.md", report(paths, peer_names, args, argv),
                   title="What each router adds to a prompt's TTFT, one request at a time")
    (out / "results.json").write_text(json.dumps(
        {"machine": machine_info(repo_root()), "argv": list(argv), "paths": paths,
         "ttft_seconds": measured}, indent=2))
    print((out / "results.md").read_text())
    return 0
