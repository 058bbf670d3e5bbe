"""``python -m loadtest.calibrate``: fit ``prefixgate sim`` to vLLM-on-CPU.

Method (details in the modules of ``loadtest.calibration``):

1. Start the target -- by default one real vLLM-on-CPU replica of
   ``--model`` (a folder of the setup made by ``deploy/vllm-cpu/setup.sh``)
   pinned to ``--core`` -- or probe ``--target-url``. This process pins
   itself to the other cores so the client does not steal the engine's.
2. Run the probe set (``calibration.probes``): cold prefill TTFT vs prompt
   length, the same prompts again from the prefix cache, and TPOT vs the
   number of concurrent streams. The target is stopped afterwards.
3. Fit ``--step-overhead``, ``--prefill-per-token`` and ``--decode-per-seq``
   by non-negative least squares on relative errors (``calibration.model``),
   the cold-prefill and decode probes jointly; the cached probe is held out.
4. Start ``prefixgate sim`` with those flags (time-scale 1, the same block
   size, scheduler limits, tokenizer and core), run the same probes, compare
   point by point; then ``--refine`` times: remove the simulator's own
   measured bias from the targets, fit again, run again. The round with the
   lowest RMS relative error wins.

   On a shared machine every sample also records how much of the engine's
   core other processes took meanwhile; medians are taken over the samples
   where that stayed under ``--max-foreign-cpu`` (``calibration.points``).
5. Write ``--out`` (JSON), the PNG and Markdown beside it, print the table
   and the flags.

Exit status 0 on success, 2 when the target cannot be started or a probe
fails (the message says why).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path

from engine.tokenizer import bundled_qwen_tokenizer_dir
from engine.vllm.local import ReplicaStartError, VllmCpuSetup
from loadtest.calibration.compare import compare
from loadtest.calibration.cpu import CoreMeter
from loadtest.calibration.model import StepShape, diagnostic_fits, fit, refine
from loadtest.calibration.points import summarise
from loadtest.calibration.probes import CalibrationProbeError, ProbePlan, ProbeResults, probe_server
from loadtest.calibration.report import markdown_report, plot, to_json, write_json
from loadtest.calibration.result import Calibration, SimRound
from loadtest.calibration.targets import EngineLimits, Target, sim_target, url_target, vllm_target
from loadtest.machine import machine_info
from loadtest.processes import StartError

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "loadtest" / "results" / "calibration.json"
_PLAN = ProbePlan()


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part.strip())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.calibrate",
        description="Fit the simulator's latency model to a real vLLM-on-CPU replica.")
    add = parser.add_argument
    add("--model", default="qwen2-small", help="model folder of the vLLM-on-CPU setup")
    add("--target-url", default=None, help="probe this running server instead of starting vLLM")
    add("--target-model", default=None, help="served model name at --target-url")
    add("--tokenizer", default=None,
        help="tokenizer folder for the simulator (default: the model folder, else bundled Qwen3)")
    add("--core", type=int, default=0, help="core the engine and the simulator run on")
    add("--lengths", type=_ints, default=_PLAN.prompt_lengths, help="prompt lengths")
    add("--prefill-repeats", type=int, default=_PLAN.prefill_repeats)
    add("--batches", type=_ints, default=_PLAN.batch_sizes, help="concurrent streams")
    add("--decode-repeats", type=int, default=_PLAN.decode_repeats)
    add("--decode-tokens", type=int, default=_PLAN.decode_max_tokens)
    add("--no-warmup", action="store_true", help="skip the discarded warm-up pass")
    add("--refine", type=int, default=2, help="refinement rounds after the first fit")
    add("--max-foreign-cpu", type=float, default=0.25,
        help="use samples during which other processes took at most this share of the core")
    add("--all-samples", action="store_true", help="take medians over every sample")
    add("--seed", type=int, default=0)
    add("--out", type=Path, default=DEFAULT_OUT, help="JSON path; .png and .md go beside it")
    return parser


def plan_from_args(args: argparse.Namespace) -> ProbePlan:
    return ProbePlan(
        prompt_lengths=args.lengths, prefill_repeats=args.prefill_repeats,
        batch_sizes=args.batches, decode_repeats=args.decode_repeats,
        decode_max_tokens=args.decode_tokens, warmup=not args.no_warmup, seed=args.seed)


def measure(target: Target, plan: ProbePlan, log: Callable[[str], None]) -> ProbeResults:
    meter = None
    if target.core is not None:
        meter = CoreMeter.available(target.core, target.process_group)
    return asyncio.run(probe_server(target.base_url, target.model, plan, time.perf_counter,
                                    lambda text: log(f"  [{target.kind}] {text}"), meter))


def fit_and_validate(
    target: Target,
    real: ProbeResults,
    real_seconds: float,
    plan: ProbePlan,
    limits: EngineLimits,
    tokenizer: str,
    refine_rounds: int,
    core: int | None,
    max_foreign: float | None,
    log: Callable[[str], None],
) -> Calibration:
    """Steps 3-4 of the module docstring: fit, then run and refine simulators."""
    shape = StepShape(limits.max_num_batched_tokens)
    real_points = tuple(summarise(real, max_foreign))
    current = fit(real_points, shape)
    rounds: list[SimRound] = []
    with tempfile.TemporaryDirectory(prefix="calibrate-sim-") as log_dir:
        for index in range(refine_rounds + 1):
            log(f"simulator round {index}: {current.params.flag_text()}")
            started = time.monotonic()
            with sim_target(target.model, tokenizer, limits, current.params, core,
                            Path(log_dir)) as sim:
                results = measure(sim, plan, log)
            points = tuple(summarise(results, max_foreign))
            comparison = compare(real_points, points)
            rounds.append(SimRound(index, current, results, points, comparison,
                                   time.monotonic() - started))
            log(f"  RMS relative error {comparison.score():.1%}")
            if index < refine_rounds:
                current = refine(current.params, real_points, points, shape)
    return Calibration(target, plan, limits, shape, tokenizer, max_foreign, real, real_points,
                       real_seconds, diagnostic_fits(real_points, shape), tuple(rounds))


def default_tokenizer(model: str) -> str:
    folder = VllmCpuSetup.locate().model_path(model)
    if (folder / "tokenizer.json").is_file():
        return str(folder)
    bundled = bundled_qwen_tokenizer_dir()
    if bundled is None:
        raise SystemExit("no tokenizer: pass --tokenizer")
    return bundled


def pin_client(core: int) -> list[int]:
    """Keep this process off the engine's core when there is another one."""
    others = sorted(os.sched_getaffinity(0) - {core})
    if others:
        os.sched_setaffinity(0, others)
    return sorted(os.sched_getaffinity(0))


def open_target(args: argparse.Namespace, limits: EngineLimits) -> AbstractContextManager[Target]:
    if args.target_url:
        return url_target(args.target_url, args.target_model)
    return vllm_target(args.model, limits, args.core)


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = "python -m loadtest.calibrate " + shlex.join(
        sys.argv[1:] if argv is None else list(argv))
    started = time.monotonic()
    plan = plan_from_args(args)
    limits = EngineLimits()
    tokenizer = args.tokenizer or default_tokenizer(args.model)
    client_cores = pin_client(args.core)
    try:
        with open_target(args, limits) as target:
            _log(f"probing {target.kind} {target.model} at {target.base_url}")
            probe_start = time.monotonic()
            real = measure(target, plan, _log)
            real_seconds = time.monotonic() - probe_start
        calibration = fit_and_validate(target, real, real_seconds, plan, limits, tokenizer,
                                       args.refine, args.core,
                                       None if args.all_samples else args.max_foreign_cpu, _log)
    except (ReplicaStartError, StartError, CalibrationProbeError) as exc:
        _log(f"calibration failed: {exc}")
        return 2
    machine = {**machine_info(REPO_ROOT), "client_cores": client_cores,
               "total_seconds": round(time.monotonic() - started, 1)}
    document = to_json(calibration, command, machine)
    write_json(document, args.out)
    plot(calibration, args.out.with_suffix(".png"))
    table = markdown_report(calibration)
    args.out.with_suffix(".md").write_text(table)
    print(table)
    print(f"prefixgate sim {calibration.best.fit.params.flag_text()}")
    _log(f"wrote {args.out} (+ .png, .md) in {machine['total_seconds']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
