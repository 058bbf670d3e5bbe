"""``python -m loadtest replay-check``: does a replay of recorded traffic predict real replicas?

    python -m loadtest replay-check --out loadtest/results/replay-check \\
        --workload shared-prefix --groups 16 --prompts-per-group 20 --rate 1.0

Phases (``--phases``, default all, in this order; each reads what the earlier
ones left in ``--out``, so one can be run again alone):

``record``  the base run on two real vLLM-on-CPU replicas behind the gateway,
            the gateway recording its trace, ``prefixgate fit`` reading the
            replicas meanwhile (``loadtest.replay_check.real``);
``fit``     ``prefixgate fit --readings`` on what was read: the model file;
``replay``  ``prefixgate replay`` of the base recording on two simulated
            replicas: as recorded, with the recorded routing (diagnostic), at
            2x the rate, with half the KV blocks (``.scenarios``) -- the
            predictions are written before the real what-ifs run;
``rate``    the real run at 2x the rate;
``kv``      the real run with half the KV blocks;
``report``  ``results.md``, ``results.json``, ``replay-check.png`` (``.verdict``
            says what is compared and the targets).

Each real run holds the shared bench lock (``--lock``) for its own duration
only. ``--replicas sim`` puts ``prefixgate sim`` processes where the vLLM
servers were: the harness's self-check, seconds instead of minutes.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import secrets
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gateway.replay.fit_cli import run as fit_run
from loadtest.machine import machine_info
from loadtest.measure import RunLimits
from loadtest.replay_check import report
from loadtest.replay_check.real import BENCH_LOCK, EngineShape, RealRun, bench_lock, run_real
from loadtest.replay_check.scenarios import (
    RECORDED_ROUTING,
    REPEAT,
    SCENARIOS,
    WHAT_IFS,
    Scenario,
    replay_argv,
    run_replay,
    scenario_workload,
)
from loadtest.replay_check.verdict import (
    Figures,
    base_checks,
    noise_checks,
    real_figures,
    sim_figures,
    what_if_checks,
)
from loadtest.workloads.mooncake import repo_root
from loadtest.workloads.registry import add_workload_arguments, workload_overrides

PHASES = ("record", "fit", "replay", "rate", "kv", "repeat", "report")
DEFAULT_WORKLOAD = {"groups": 16, "prompts_per_group": 16, "system_len": 1024,
                    "question_len": 64, "output_len": 16, "rate": 1.0}
"""shared-prefix unless told otherwise: 256 requests behind 16 apps' system prompts, at a
rate whose double two qwen2-tiny replicas on this 2-core machine still serve (a first
fit here put their decode at ~35 ms per sequence: 32-token answers at 2/s would not be)."""
REAL_PHASE = {"record": "base", "rate": "rate-2x", "kv": "kv-half", "repeat": "repeat"}


def add_parser(commands: Any) -> None:
    p = commands.add_parser("replay-check", help="record, fit, replay, and re-run for real: "
                                                 "does the replay predict the replicas?")
    p.add_argument("--out", type=Path, required=True, help="results folder")
    p.add_argument("--phases", default=",".join(PHASES),
                   help=f"comma-separated, of {', '.join(PHASES)} (default all)")
    p.add_argument("--replicas", choices=("vllm-cpu", "sim"), default="vllm-cpu",
                   help="two real vLLM-on-CPU replicas (default), or two prefixgate sims")
    p.add_argument("--vllm-model", default="qwen2-tiny", help="vllm-cpu: the model folder")
    p.add_argument("--blocks", type=int, default=320,
                   help="KV blocks per replica in the base run (32 tokens each)")
    p.add_argument("--max-num-seqs", type=int, default=128)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--sim-args", default="", help="sim: flags for each sim replica")
    p.add_argument("--policy", default="prefix", help="the gateway's policy")
    p.add_argument("--fit-interval", type=float, default=5.0,
                   help="seconds between two readings of a replica for the fit")
    p.add_argument("--lock", type=Path, default=BENCH_LOCK,
                   help=f"the bench lock each real run holds (default {BENCH_LOCK})")
    p.add_argument("--no-lock", dest="lock", action="store_const", const=None)
    p.add_argument("--max-duration", type=float, default=600.0,
                   help="seconds after which a real run sends no new request")
    p.add_argument("--request-timeout", type=float, default=120.0)
    p.add_argument("--title", default="Replay against real replicas")
    add_workload_arguments(p, required=False)


def _workload(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    name = args.workload or "shared-prefix"
    overrides = workload_overrides(args)
    if name == "shared-prefix":
        overrides = {**DEFAULT_WORKLOAD, **overrides}
    return name, overrides


def _shape(args: argparse.Namespace) -> EngineShape:
    return EngineShape(kind=args.replicas, model=args.vllm_model, blocks=args.blocks,
                       max_num_seqs=args.max_num_seqs,
                       max_num_batched_tokens=args.max_num_batched_tokens,
                       sim_args=tuple(shlex.split(args.sim_args)))


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def real_phase(args: argparse.Namespace, scenario: Scenario, secret: str) -> None:
    name, overrides = _workload(args)
    shape = _shape(args)
    run = RealRun(scenario.name, scenario_workload(name, overrides, scenario),
                  scenario.blocks(args.blocks), args.policy, secret,
                  fit_interval_s=args.fit_interval if scenario.name == "base" else None)
    limits = RunLimits(max_duration=args.max_duration, request_timeout=args.request_timeout)
    with bench_lock(args.lock) as waited:
        started = time.monotonic()
        load_before = os.getloadavg()
        result = run_real(run, shape, args.out / scenario.name, limits)
        seconds = time.monotonic() - started
        load_after = os.getloadavg()
    meta = {"lock_wait_s": round(waited, 1), "run_seconds": round(seconds, 1),
            "loadavg_1m_before": round(load_before[0], 2),
            "loadavg_1m_after": round(load_after[0], 2),
            "blocks": run.blocks, "workload": run.workload.params,
            "pacing": run.workload.pacing.describe(), "commands": list(result.commands)}
    (args.out / scenario.name / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    _say(f"== {scenario.name}: done in {seconds:.0f} s (waited {waited:.0f} s for the lock)")


def fit_phase(args: argparse.Namespace) -> None:
    base = args.out / "base"
    argv = ["prefixgate", "fit", "--readings", str(base / "readings.jsonl"),
            "--trace", str(base / "trace.jsonl"),
            "--max-num-seqs", str(args.max_num_seqs),
            "--max-num-batched-tokens", str(args.max_num_batched_tokens),
            "--out", str(base / "model.json")]
    out, err = io.StringIO(), io.StringIO()
    code = fit_run(argv[2:], out, err)
    if code != 0:
        raise RuntimeError(f"{shlex.join(argv)}: {err.getvalue().strip()}")
    (base / "fit.json").write_text(json.dumps({"command": shlex.join(argv),
                                               "output": out.getvalue()}, indent=2) + "\n")
    _say(out.getvalue().rstrip())


def _model_blocks(model_file: Path) -> int:
    return int(json.loads(model_file.read_text())["num_blocks"])


def replay_phase(args: argparse.Namespace) -> None:
    base = args.out / "base"
    model_file = base / "model.json"
    blocks = _model_blocks(model_file)
    for scenario in (*SCENARIOS, RECORDED_ROUTING):
        out = args.out / f"replay-{scenario.name}.json"
        argv = replay_argv(base / "trace.jsonl", model_file, scenario, blocks, out)
        started = time.monotonic()
        document = run_replay(argv)
        document["command"] = shlex.join(argv)
        out.write_text(json.dumps(document, indent=2) + "\n")
        _say(f"== replay {scenario.name}: {time.monotonic() - started:.1f} s: {shlex.join(argv)}")


def _read(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _figures_dict(figures: Figures | None) -> dict[str, Any] | None:
    return None if figures is None else figures.__dict__.copy()


def report_phase(args: argparse.Namespace, argv: Sequence[str]) -> dict[str, Path]:
    name, overrides = _workload(args)
    scenarios: dict[str, dict[str, Any]] = {}
    real: dict[str, Figures] = {}
    predicted: dict[str, Figures] = {}
    for scenario in (*SCENARIOS, REPEAT, RECORDED_ROUTING):
        folder = args.out / scenario.name
        item: dict[str, Any] = {"label": scenario.label}
        trace = folder / "trace.jsonl"
        if scenario.real and trace.is_file():
            real[scenario.name] = real_figures(trace)
            run = _read(folder / "run.json") or {}
            item["client"] = {"ttft_p50_s": (run.get("ttft") or {}).get("p50"),
                              "ttft_p99_s": (run.get("ttft") or {}).get("p99"),
                              "replica_hit_rate": run.get("hit_rate"),
                              "ok": run.get("ok"), "errors": run.get("errors")}
            item.update({k: v for k, v in (_read(folder / "meta.json") or {}).items()
                         if k in ("run_seconds", "lock_wait_s", "blocks", "pacing",
                                  "loadavg_1m_before", "loadavg_1m_after")})
        replay = _read(args.out / f"replay-{scenario.name if scenario.replayed else 'base'}.json")
        if replay is not None:
            predicted[scenario.name] = sim_figures(replay)
            if scenario.replayed:
                item["replay_command"] = replay.get("command")
        item["real"] = _figures_dict(real.get(scenario.name if scenario.real else "base"))
        item["predicted"] = _figures_dict(predicted.get(scenario.name))
        scenarios[scenario.name] = item
    checks = []
    if "base" in real and "base" in predicted:
        checks += base_checks(real["base"], predicted["base"])
        for scenario in WHAT_IFS:
            if scenario.name in real and scenario.name in predicted:
                checks += what_if_checks(scenario.name, real["base"], real[scenario.name],
                                         predicted["base"], predicted[scenario.name])
        if REPEAT.name in real:
            checks += noise_checks(real["base"], real[REPEAT.name])
    machine = machine_info(repo_root())
    document = {
        "title": args.title, "command": "python -m loadtest " + shlex.join(argv),
        "machine": machine, "date": machine["date"],
        "machine_line": f"{machine['nproc']} cores, {machine['cpu']}, commit {machine['commit']}",
        "workload": {"name": name, "params": overrides},
        "workload_line": f"{name} " + ", ".join(f"{k}={v}" for k, v in overrides.items()),
        "replicas_line": (f"2 x {args.replicas}"
                          + (f" {args.vllm_model}" if args.replicas == "vllm-cpu" else "")
                          + f", {args.blocks} KV blocks of 32 each (kv-half: "
                          f"{args.blocks // 2}), max {args.max_num_seqs} sequences, "
                          f"{args.max_num_batched_tokens} tokens a step; policy {args.policy}"),
        "fit": _read(args.out / "base" / "fit.json"),
        "scenarios": scenarios, "checks": [c.as_dict() for c in checks],
    }
    return report.write(document, args.out)


def replay_check_command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = sorted(set(phases) - set(PHASES))
    if unknown:
        raise ValueError(f"unknown phase(s) {', '.join(unknown)}; known: {', '.join(PHASES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_hex(24)  # one deployment's key for every run of this check
    by_name = {s.name: s for s in (*SCENARIOS, REPEAT)}
    for phase in PHASES:
        if phase not in phases:
            continue
        if phase in REAL_PHASE:
            real_phase(args, by_name[REAL_PHASE[phase]], secret)
        elif phase == "fit":
            fit_phase(args)
        elif phase == "replay":
            replay_phase(args)
        else:
            paths = report_phase(args, argv)
            print(paths["md"].read_text())
    return 0
