"""The ``python -m loadtest`` command.

    python -m loadtest run      --target URL --workload NAME [params] --out DIR
                                [--replica-metrics URL ...] [--label NAME]
    python -m loadtest overhead [--concurrency 100 --prompt-len 2048 ...] --out DIR
    python -m loadtest compare  --replicas sim:4 --workload NAME [params] --out DIR
                                [--contenders a,b,...] [--replica-args "..."]
                                [--replicas vllm-cpu:2 --vllm-model M --vllm-blocks N]
    python -m loadtest replay-check --out DIR [--workload NAME params] [--phases ...]
                                (record, fit, replay, re-run for real: issue 28)
    python -m loadtest profile  --pid PID --duration 30 --out DIR
                                (where a running gateway's time goes, by stage: py-spy)
    python -m loadtest cold-prompts [--policy P --peers LIST --warm] --out DIR
                                (what each router adds to a new prompt's TTFT)
    python -m loadtest workloads    list the workloads and their parameters

Every load goes to 127.0.0.1 (the simulated or vLLM-on-CPU replicas and routers
this command starts, or the ``--target`` given) and is bounded by ``--max-duration``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import httpx

from engine.spawning import exit_on_signal
from loadtest.cold_prompts import add_parser as add_cold_prompts_parser
from loadtest.cold_prompts import cold_prompts_command
from loadtest.compare import compare_command
from loadtest.loop import run
from loadtest.machine import machine_info
from loadtest.measure import RunLimits, RunTarget, measure
from loadtest.overhead import overhead_command
from loadtest.plots import write_plots
from loadtest.profile import add_parser as add_profile_parser
from loadtest.profile import profile_command
from loadtest.replay_check.cli import add_parser as add_replay_check_parser
from loadtest.replay_check.cli import replay_check_command
from loadtest.report import write_outputs
from loadtest.results import ContenderResult
from loadtest.vllm_bench import add_parser as add_vllm_bench_parser
from loadtest.vllm_bench import vllm_bench_command
from loadtest.vllm_fleet import VLLM_CPU_MODELS
from loadtest.workloads.mooncake import repo_root
from loadtest.workloads.registry import (
    add_workload_arguments,
    build_workload,
    workload_overrides,
    workload_specs,
)


def _limits_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-duration", type=float, default=300.0,
                        help="seconds after which no new request is sent (default 300)")
    parser.add_argument("--request-timeout", type=float, default=120.0)
    parser.add_argument("--sample-period", type=float, default=0.5,
                        help="seconds between replica load samples")


def _limits(args: argparse.Namespace) -> RunLimits:
    return RunLimits(max_duration=args.max_duration, request_timeout=args.request_timeout,
                     sample_period=args.sample_period)


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="python -m loadtest", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = root.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="drive one workload against one endpoint")
    run.add_argument("--target", required=True, help="server root, e.g. http://127.0.0.1:8000")
    run.add_argument("--model", help="model name (default: the first of GET /v1/models)")
    run.add_argument("--label", help="name of this contender in the report (default: the URL)")
    run.add_argument("--replica-metrics", nargs="*", default=[], metavar="URL",
                     help="replica roots whose /metrics give the true hit rate and load")
    run.add_argument("--out", required=True, type=Path)
    add_workload_arguments(run)
    _limits_arguments(run)

    overhead = commands.add_parser("overhead", help="gateway overhead vs a direct connection")
    overhead.add_argument("--out", required=True, type=Path)
    overhead.add_argument("--concurrency", type=int, default=100)
    overhead.add_argument("--requests", type=int, default=600,
                          help="requests per round and path")
    overhead.add_argument("--rounds", type=int, default=3,
                          help="alternating direct/gateway rounds (each path runs every round)")
    overhead.add_argument("--prompt-len", type=int, default=2048)
    overhead.add_argument("--output-len", type=int, default=16)
    overhead.add_argument("--distinct-prompts", type=int, default=64)
    overhead.add_argument("--time-scale", type=float, default=1000.0)
    overhead.add_argument("--num-blocks", type=int, default=16384)
    overhead.add_argument("--policy", default="least_load")
    overhead.add_argument("--rate", type=float, default=None,
                          help="open loop: Poisson arrivals per second (--concurrency then caps "
                               "requests in flight; 0 = no cap). Default: closed loop")
    overhead.add_argument("--sim-args", default="",
                          help='extra flags for the replica, e.g. "--step-overhead 0.02"')
    overhead.add_argument("--client", choices=("openai", "raw"), default="openai",
                          help="load generator: the official openai client, or a lean aiohttp "
                               "SSE reader (LeanClient in loadtest/client.py) that needs ~5x less CPU")
    overhead.add_argument("--pin", action="store_true",
                          help="give each gateway CPU 0 and the replica and the load generator "
                               "the other CPUs (Linux)")
    overhead.add_argument("--core-quota", type=float, default=None, metavar="CORES",
                          help="limit each serving process of every proxy path (a gateway "
                               "worker, the null proxy, a peer) to this share of one core "
                               "(Linux cgroups, loadtest/cpu_quota.py): the routers are the "
                               "bottleneck at saturation, as on a machine with a core for each")
    overhead.add_argument("--null-proxy", action="store_true",
                          help="also measure a pass-through proxy on the gateway's server stack "
                               "(loadtest/null_proxy.py): what the extra hop alone costs")
    overhead.add_argument("--peers", default="", metavar="LIST",
                          help="peer routers in front of the same replica, comma-separated, e.g. "
                               "sglang-router:cache_aware,vllm-router:cache_aware (installed on "
                               "first use; one that cannot be is reported unavailable)")
    overhead.add_argument("--cpu-sections", action="store_true",
                          help="also report each gateway's CPU by section of its work "
                               "(parse, render, tokenize, decide, KV events, lint, ...: "
                               "loadtest/sections.py), per request")
    overhead.add_argument("--rotate", action="store_true",
                          help="shift the order of the paths by one each round, so that no path "
                               "always runs first or last")
    _limits_arguments(overhead)

    compare = commands.add_parser("compare", help="every router in front of the same replicas")
    compare.add_argument("--replicas", default="sim:4",
                         help="sim:N (simulated replicas) or vllm-cpu:N (real vLLM on CPU)")
    compare.add_argument("--replica-args", default="",
                         help='extra flags for every replica, e.g. "--num-blocks 400 '
                              '--time-scale 10" for sims')
    compare.add_argument("--vllm-model", default="qwen2-small", choices=VLLM_CPU_MODELS,
                         help="vllm-cpu: the model folder (default qwen2-small)")
    compare.add_argument("--vllm-blocks", type=int, default=320,
                         help="vllm-cpu: KV blocks of 32 tokens per replica "
                              "(--num-gpu-blocks-override, default 320)")
    compare.add_argument("--contenders", default="all",
                         help="comma-separated names (see --list-contenders) or 'all'")
    compare.add_argument("--list-contenders", action="store_true",
                         help="print the contender names and exit")
    compare.add_argument("--out", type=Path, help="output folder (required to run)")
    compare.add_argument("--title", help="report title")
    compare.add_argument("--warmup", type=float, default=20.0, metavar="SECONDS",
                         help="drive the workload straight at the replicas for this long before "
                              "the first contender, results dropped, so that the first contender "
                              "does not alone meet cold replicas (default 20; 0: none)")
    add_workload_arguments(compare, required=False)
    _limits_arguments(compare)

    commands.add_parser("workloads", help="list workloads and their parameters")
    add_vllm_bench_parser(commands)
    add_replay_check_parser(commands)
    add_profile_parser(commands)
    add_cold_prompts_parser(commands)
    return root


async def _first_model(target: str) -> str:
    """The first model ``target`` serves; ``SystemExit`` naming what went wrong when it
    cannot say (a load test against a server that is not there ends with one line)."""
    url = target.rstrip("/") + "/v1/models"
    try:
        async with httpx.AsyncClient(timeout=10.0) as client:
            response = await client.get(url)
            response.raise_for_status()
            return str(response.json()["data"][0]["id"])
    except httpx.HTTPError as exc:
        raise SystemExit(f"loadtest: GET {url}: {type(exc).__name__}: {exc} (is the server "
                         "up? --model NAME skips this question)") from None
    except (ValueError, KeyError, IndexError, TypeError):
        raise SystemExit(f"loadtest: GET {url} listed no model; give one with --model "
                         "NAME") from None


def run_command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    workload = build_workload(args.workload, workload_overrides(args))
    model = args.model or asyncio.run(_first_model(args.target))
    target = RunTarget(args.label or args.target, args.target, model)
    measured = run(lambda: measure(workload, target, args.replica_metrics, _limits(args)))
    result = ContenderResult(target.label, run=measured)
    meta = {
        "command": "python -m loadtest " + " ".join(argv),
        "machine": machine_info(repo_root()),
        "workload": {"name": workload.name, "requests": workload.request_count,
                     "pacing": workload.pacing.describe(), "params": workload.params},
        "target": dataclasses.asdict(target),
    }
    title = f"{workload.name} against {target.label}"
    paths = write_outputs(args.out, meta, [result], None, title)
    write_plots(args.out, [result], title, None)
    print(paths["md"].read_text())
    return 0


def workloads_command() -> int:
    for spec in workload_specs().values():
        fields = ", ".join(f"{f.name}={f.default!r}" for f in dataclasses.fields(spec.params_type))
        print(f"{spec.name}: {spec.summary}\n    {fields}")
    return 0


def stop_cleanly_on_sigterm() -> None:
    """A SIGTERM (a killed suite, a timeout) ends the run as Ctrl-C would: the
    context managers stop every replica and router the run started. Each runs in
    its own process group (``loadtest.processes``), so without this a killed run
    left them serving; one gateway of a killed run was found still probing its
    vanished replicas 14 minutes later. A SIGTERM while a process is spawned exits
    once it is held (``engine.spawning``)."""
    signal.signal(signal.SIGTERM, exit_on_signal)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    try:
        if args.command == "run":
            return run_command(args, argv)
        if args.command == "workloads":
            return workloads_command()
        if args.command == "overhead":
            return overhead_command(args, argv)
        if args.command == "vllm-bench":
            return vllm_bench_command(args, argv)
        if args.command == "replay-check":
            return replay_check_command(args, argv)
        if args.command == "profile":
            return profile_command(args)
        if args.command == "cold-prompts":
            return cold_prompts_command(args, argv)
        return compare_command(args, argv)
    except (ValueError, FileNotFoundError) as exc:
        print(f"loadtest: {exc}", file=sys.stderr)
        return 2
