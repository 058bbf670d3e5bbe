"""``prefixgate fit``: the latency model of live replicas, from their own vLLM metrics.

    prefixgate fit --replica http://10.0.0.5:8000 --replica http://10.0.0.6:8000 \\
        --duration 600 --out model.json

Reads each replica's ``/metrics`` every ``--interval`` seconds for
``--duration`` seconds (Ctrl-C or SIGTERM ends it early and fits what was
read: a job runner or ``timeout`` stops it with SIGTERM) while
the replicas serve their traffic, fits the simulator's three step parameters
(``gateway.replay.fit``) and writes the model file ``prefixgate replay
--latency-model`` and ``prefixgate sim --latency-model`` take
(``engine.sim.latency``). vLLM publishes its block size and capacity
(``vllm:cache_config_info``) but not its scheduler limits: give
``--max-num-seqs`` and ``--max-num-batched-tokens`` as the replicas were
launched. ``--save-readings`` keeps what was read (small JSON lines), and
``--readings`` fits from such a file instead of reading replicas.
``--trace`` (the gateway's trace of the same period) adds the gateway's own
part of the TTFT to the time a request spends outside the engine's steps
(``request_overhead_s``, ``gateway.replay.fit``).

Exit status 0; 2 when nothing could be read or there was nothing to fit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TextIO

import httpx

from engine.cli_args import CommandParser
from gateway.replay.fit import Fit, FitError, fit_latency
from gateway.replay.report import seconds
from gateway.replay.scrape import Reading, parse_reading
from gateway.replay.workload import read_lines
from gateway.trace.format import TraceFormatError


def _parser() -> argparse.ArgumentParser:
    p = CommandParser(
        prog="prefixgate fit",
        description="Fit the simulator's latency model to live vLLM replicas from their "
                    "metrics, while they serve traffic.")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--replica", action="append", metavar="URL",
                        help="a replica's base URL (its /metrics is read); repeat")
    source.add_argument("--readings", type=Path, metavar="FILE",
                        help="fit from readings saved by --save-readings")
    p.add_argument("--duration", type=float, default=300.0,
                   help="seconds to read for (default 300)")
    p.add_argument("--interval", type=float, default=5.0,
                   help="seconds between two readings of a replica (default 5)")
    p.add_argument("--api-key", help="bearer key the replicas want, if any")
    p.add_argument("--max-num-seqs", type=int, default=256,
                   help="the replicas' --max-num-seqs (default 256)")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192,
                   help="the replicas' --max-num-batched-tokens (default 8192)")
    p.add_argument("--save-readings", type=Path, metavar="FILE",
                   help="also write the readings here (JSON lines)")
    p.add_argument("--trace", type=Path, nargs="+", metavar="TRACE",
                   help="the gateway's trace of the same period: its TTFTs against the "
                        "replicas' give the gateway's part of the request overhead")
    p.add_argument("--out", type=Path, required=True, help="the latency-model file to write")
    return p


def read_replicas(urls: Sequence[str], duration: float, interval: float,
                  api_key: str | None, log: Callable[[str], None],
                  clock: Callable[[], float] = time.time,
                  sleep: Callable[[float], None] = time.sleep) -> dict[str, list[Reading]]:
    """Every replica's readings, one round per ``interval`` for ``duration`` seconds."""
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    readings: dict[str, list[Reading]] = {url: [] for url in urls}
    started = clock()
    with httpx.Client(timeout=10.0, headers=headers) as client:
        try:
            while True:
                round_at = clock()
                for url in urls:
                    try:
                        response = client.get(url.rstrip("/") + "/metrics")
                        response.raise_for_status()
                    except httpx.HTTPError as exc:
                        log(f"  {url}: {exc}")
                        continue
                    readings[url].append(parse_reading(response.text, clock()))
                elapsed = clock() - started
                if elapsed >= duration:
                    break
                # loadtest/replay_check/real.py waits on this line's count: keep its form
                log(f"  read {sum(len(r) for r in readings.values())} times, "
                    f"{elapsed:.0f}/{duration:.0f} s")
                sleep(max(0.0, interval - (clock() - round_at)))
        except KeyboardInterrupt:
            log("  interrupted: fitting what was read")
    return readings


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM stops the reading as Ctrl-C does (main thread only; restored after)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def save_readings(readings: dict[str, list[Reading]], path: Path) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for replica, series in readings.items():
            for reading in series:
                handle.write(json.dumps({"replica": replica, **asdict(reading)}) + "\n")


def load_readings(path: Path) -> dict[str, list[Reading]]:
    readings: dict[str, list[Reading]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        replica = item.pop("replica")
        item["models"] = tuple(item.get("models") or ())
        readings.setdefault(replica, []).append(Reading(**item))
    return readings


def gateway_ttft(traces: Sequence[Path], readings: dict[str, list[Reading]]) -> float | None:
    """The mean TTFT the gateway measured for requests that arrived while the replicas
    were read (None: no such line)."""
    stamps = [r.at for series in readings.values() for r in series]
    if not stamps:
        return None
    start, end = min(stamps) * 1000, max(stamps) * 1000
    ttfts = [line.ttft_ms for line in read_lines(traces)
             if line.ttft_ms is not None and start <= line.timestamp_ms <= end]
    return sum(ttfts) / len(ttfts) / 1000 if ttfts else None


def render(fit: Fit, out: Path) -> str:
    p, m = fit.model.params, fit.model
    check = fit.check()
    return "\n".join([
        (f"prefixgate fit: {len(fit.windows)} windows of {len(m.source.get('replicas', []))} "
        f"replica(s), {fit.rows} rows, RMS relative residual {fit.rms_relative_residual:.1%}"),
        f"  step overhead      {seconds(p.step_overhead_s)}",
        f"  per prefill token  {p.prefill_per_token_s * 1e6:.4g} us",
        f"  per decoding seq   {seconds(p.decode_per_seq_s)}",
        (f"  KV {m.num_blocks:,} blocks of {m.block_size}, max {m.max_num_seqs} sequences, "
        f"{m.max_num_batched_tokens:,} tokens a step, model {m.model or '?'}"),
        (f"  outside the steps {seconds(m.request_overhead_s)} a request (serving front "
        f"{seconds(fit.front_s)}"
        + (f", gateway {seconds(fit.gateway_s)}" if fit.gateway_s is not None else
           ", gateway not known: --trace") + ")"),
        (f"  measured meanwhile: mean queue {seconds(check['mean_queue_s'])}, prefill "
        f"{seconds(check['mean_prefill_s'])}, TTFT {seconds(check['mean_ttft_s'])}, "
        f"median window ITL {seconds(check['median_window_itl_s'])}"),
        f"wrote {out}  (prefixgate sim {p.flag_text()})",
    ]) + "\n"


def main(argv: Sequence[str]) -> int:
    return run(argv, sys.stdout, sys.stderr)


def run(argv: Sequence[str], out: TextIO, err: TextIO) -> int:
    args = _parser().parse_args(list(argv))

    def log(text: str) -> None:
        print(text, file=err, flush=True)

    if args.readings:
        try:
            readings = load_readings(args.readings)
        except (OSError, ValueError, TypeError, KeyError) as exc:
            print(f"prefixgate fit: {args.readings}: {exc}", file=err)
            return 2
    else:
        log(f"reading {len(args.replica)} replica(s) every {args.interval:g} s for "
            f"{args.duration:g} s")
        with sigterm_interrupts():
            readings = read_replicas(args.replica, args.duration, args.interval, args.api_key,
                                     log)
    if args.save_readings:
        save_readings(readings, args.save_readings)
    try:
        gateway = gateway_ttft(args.trace, readings) if args.trace else None
        fit = fit_latency(readings, max_num_seqs=args.max_num_seqs,
                          max_num_batched_tokens=args.max_num_batched_tokens,
                          gateway_ttft_s=gateway)
    except (FitError, OSError, TraceFormatError) as exc:
        print(f"prefixgate fit: {exc}", file=err)
        return 2
    fit.model.write(args.out)
    out.write(render(fit, args.out))
    return 0
