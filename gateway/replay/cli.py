"""``prefixgate replay TRACE...``: what N replicas would have done with a recorded trace.

    prefixgate replay trace.jsonl --latency-model model.json --replicas 2
    prefixgate replay trace.jsonl* --latency-model model.json --ttft-p99 0.5 --plot n.png
    prefixgate replay trace.jsonl --latency-model model.json --replicas 2 \\
        --profile qwen2.5-72b-tp4 --model-config config.json --kv-cache-dtype fp8

Replays the trace (``gateway.replay.fleet``: the gateway's own policy over
the simulator's engines, in simulated time) on each replica count asked
(``--replicas 4``, ``2,4,8`` or ``1-8``), or, with ``--ttft-p99 SECONDS``
(``--quantile`` for another), searches for the smallest count that keeps TTFT
at the quantile under it (``gateway.replay.search``). Prints a report
(``--json``: one JSON object), writes it with ``--out``, plots TTFT against N
with ``--plot``. A progress bar runs on stderr when it is a terminal.

Exit status 0; 1 when a search found no count up to ``--max-replicas``; 2
for bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import yaml

from engine.cli_args import CommandParser
from engine.sim.config import SimConfig
from engine.sim.latency import LatencyModel, LatencyModelError, LatencyParams
from gateway.replay.capacity import CapacityChoice, CapacityError, resolve_capacity
from gateway.replay.fleet import RECORDED, FleetSpec
from gateway.replay.outcome import ReplayOutcome
from gateway.replay.progress import ProgressBar
from gateway.replay.report import ReplayContext, as_json, plot, render_text, trace_notes
from gateway.replay.search import Question, Replays, smallest_meeting
from gateway.replay.workload import WorkloadError, build_workload, read_lines
from gateway.trace.format import MOONCAKE_BLOCK_TOKENS, TraceFormatError


def counts(text: str) -> list[int]:
    """``4``, ``2,4,8`` or ``1-8``."""
    out: list[int] = []
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        if dash:
            out += range(int(low), int(high) + 1)
        elif low:
            out.append(int(low))
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError("replica counts must be positive: N, A,B,C or A-B")
    return sorted(set(out))


def option(text: str) -> tuple[str, Any]:
    name, equals, value = text.partition("=")
    if not equals or not name:
        raise argparse.ArgumentTypeError("a policy option is NAME=VALUE")
    return name, yaml.safe_load(value)


def _parser() -> argparse.ArgumentParser:
    p = CommandParser(
        prog="prefixgate replay",
        description="Replay a recorded trace on N simulated replicas: hit rate, TTFT, TPOT, "
                    "throughput and load per replica; or the smallest N that meets a TTFT "
                    "target.")
    p.add_argument("traces", nargs="+", metavar="TRACE",
                   help="trace file(s): the gateway's (trace.path, /admin/trace) or Mooncake's")
    p.add_argument("--latency-model", metavar="FILE",
                   help="the replicas' fitted latency model (prefixgate fit); default: the "
                        "simulator's default parameters")
    p.add_argument("--replicas", type=counts, metavar="N|A,B|A-B",
                   help="replica counts to replay (default: as many as were recorded; with "
                        "--ttft-p99: searched)")
    p.add_argument("--ttft-p99", type=float, metavar="SECONDS",
                   help="find the smallest replica count keeping TTFT at --quantile under this")
    p.add_argument("--quantile", type=float, default=0.99,
                   help="the TTFT quantile --ttft-p99 judges (default 0.99)")
    p.add_argument("--max-replicas", type=int, default=64,
                   help="largest count the search tries (default 64)")
    p.add_argument("--policy", help="routing policy (default: the recorded one, else prefix; "
                                    "'recorded': each request where it was served)")
    p.add_argument("--policy-option", type=option, action="append", default=[],
                   metavar="NAME=VALUE", help="a policy option (as policy_options); repeat")
    kv = p.add_argument_group("KV capacity of each replica (default: the latency model's)")
    kv.add_argument("--blocks", type=int, help="KV blocks per replica")
    kv.add_argument("--profile", help="a launch profile (prefixgate profiles); needs "
                                      "--model-config")
    kv.add_argument("--model-config", metavar="CONFIG",
                    help="the model's config.json (or folder) to plan the capacity with")
    kv.add_argument("--kv-cache-dtype", help="auto, fp8, int8, ... (replaces the profile's)")
    kv.add_argument("--tensor-parallel-size", type=int, default=1,
                    help="GPUs a replica spans, for --model-config without --profile (default 1)")
    kv.add_argument("--gpu-memory-gb", type=float, default=80.0,
                    help="memory of one GPU in GiB, for --model-config (default 80)")
    kv.add_argument("--gpu-memory-utilization", type=float, default=0.92,
                    help="share of it vLLM may use, for --model-config (default 0.92)")
    kv.add_argument("--max-model-len", type=int,
                    help="for --model-config (default: the config's max_position_embeddings)")
    p.add_argument("--block-size", type=int,
                   help="KV block size of the replayed replicas (default: the trace's; for a "
                        "Mooncake trace the latency model's)")
    pace = p.add_argument_group("which part of the trace, at what pace")
    pace.add_argument("--speed", type=float, default=1.0,
                      help="replay this many times the recorded rate (default 1)")
    pace.add_argument("--model", help="replay this model's lines only")
    pace.add_argument("--offset", type=int, default=0, help="skip this many requests")
    pace.add_argument("--limit", type=int, help="replay at most this many requests")
    pace.add_argument("--duration", type=float, metavar="SECONDS",
                      help="replay this many seconds of the trace")
    p.add_argument("--scrape-interval", type=float, default=1.0,
                   help="how stale the KV usage the policy sees is (the gateway's "
                        "health_interval; default 1)")
    p.add_argument("--jobs", type=int, default=1,
                   help="replays run at once in worker processes (default 1)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--out", type=Path, help="write the JSON object to this file")
    p.add_argument("--plot", type=Path, metavar="PNG", help="plot TTFT against N (matplotlib)")
    bar = p.add_mutually_exclusive_group()
    bar.add_argument("--progress", action="store_true", default=None,
                     help="show the progress bar even when stderr is not a terminal")
    bar.add_argument("--no-progress", dest="progress", action="store_false",
                     help="no progress bar, even on a terminal")
    return p


def _latency(path: str | None) -> tuple[LatencyModel, str]:
    if path:
        return LatencyModel.read(path), path
    d = SimConfig()
    return LatencyModel(LatencyParams(d.step_overhead_s, d.prefill_per_token_s,
                                      d.decode_per_seq_s), block_size=d.block_size,
                        num_blocks=d.num_blocks, max_num_seqs=d.max_num_seqs,
                        max_num_batched_tokens=d.max_num_batched_tokens), \
        "the simulator's defaults: give --latency-model"


def main(argv: Sequence[str]) -> int:
    return run(argv, sys.stdout, sys.stderr)


def run(argv: Sequence[str], out: TextIO, err: TextIO) -> int:
    args = _parser().parse_args(list(argv))
    try:
        latency, latency_source = _latency(args.latency_model)
        workload = build_workload(read_lines(args.traces), model=args.model, speed=args.speed,
                                  offset=args.offset, limit=args.limit,
                                  duration_s=args.duration)
        block_size = args.block_size or (latency.block_size
                                         if workload.trace_block == MOONCAKE_BLOCK_TOKENS
                                         else workload.trace_block)
        capacity = resolve_capacity(CapacityChoice(
            blocks=args.blocks, profile=args.profile, model_config=args.model_config,
            kv_cache_dtype=args.kv_cache_dtype, tensor_parallel_size=args.tensor_parallel_size,
            gpu_memory_gb=args.gpu_memory_gb, gpu_memory_utilization=args.gpu_memory_utilization,
            max_model_len=args.max_model_len), block_size, latency.num_blocks)
        recorded = workload.recorded()
        policy = args.policy or (workload.policies[0] if len(workload.policies) == 1
                                 else "prefix")
        spec = FleetSpec(replicas=1, latency=latency, num_blocks=capacity.blocks,
                         block_size=block_size, policy=policy,
                         policy_options=dict(args.policy_option),
                         scrape_interval_s=args.scrape_interval,
                         ttft_limit_s=args.ttft_p99, quantile=args.quantile)
        question = (Question(args.ttft_p99, args.quantile, max_replicas=args.max_replicas)
                    if args.ttft_p99 is not None else None)
    except (OSError, LatencyModelError, TraceFormatError, WorkloadError, CapacityError,
            ValueError) as exc:
        print(f"prefixgate replay: {exc}", file=err)
        return 2
    if policy == RECORDED:
        wanted = [len(recorded.replicas) or 1]
        question = None
    elif args.replicas:
        wanted = args.replicas
    else:
        wanted = [len(recorded.replicas) or 1]
    bar = ProgressBar(err, enabled=args.progress)
    answer: int | None = None
    try:
        with Replays(workload, spec, jobs=args.jobs, report=bar) as replays:
            if question is not None and not args.replicas:
                result = smallest_meeting(question, replays)
                outcomes: dict[int, ReplayOutcome] = result.outcomes
                answer = result.answer
            else:
                outcomes = replays.run(wanted)
                if question is not None:
                    meeting = [n for n in sorted(outcomes) if outcomes[n].meets]
                    answer = meeting[0] if meeting else None
    except ValueError as exc:  # a policy's option, a policy name
        bar.close()
        print(f"prefixgate replay: {exc}", file=err)
        return 2
    bar.close()
    context = ReplayContext(
        traces=tuple(os.fspath(t) for t in args.traces), requests=len(workload),
        duration_s=workload.duration_s, speed=args.speed, model=workload.model,
        latency=latency, latency_source=latency_source, capacity=capacity, policy=policy,
        recorded=recorded, notes=trace_notes(workload, capacity.max_model_len))
    document = as_json(context, outcomes, question, answer)
    if args.out:
        args.out.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    if args.plot:
        plot(outcomes, question, args.plot,
             f"{len(workload):,} requests at {args.speed:g}x, {capacity.blocks:,} blocks, "
             f"policy {policy}", answer)
    out.write(json.dumps(document, indent=2) + "\n" if args.json
              else render_text(context, outcomes, question, answer))
    return 1 if question is not None and answer is None else 0
