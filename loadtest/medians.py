"""Several runs of one comparison suite, summed up: each contender's median per workload.

One run of ``loadtest compare`` judges a tail on the 3-5 slowest requests of
a few hundred, and the order of the contenders moves it (see "How we
measure"). ``loadtest/suites/routing_shapes.sh`` with ``REPEAT=N`` runs the
suite N times, the contenders' order rotated each time, into
``OUT/run-1 .. OUT/run-N``; this module reads those runs and prints, per
workload, every contender's median hit rate and median TTFT p99 (with the
runs' range), and whether the first prefixgate contender's median p99 is at
or under the best peer router's:

    python -m loadtest.medians OUT/run-1 OUT/run-2 OUT/run-3 [--subject prefixgate:default]

A peer is a contender whose name does not start with ``prefixgate``. A
workload a contender failed in (not ``ok``) counts that run out for it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from loadtest.markdown import table


@dataclass
class Figures:
    """One contender's figures on one workload, one entry per run that measured it."""
    hit_rates: list[float] = field(default_factory=list)
    ttft_p99s: list[float] = field(default_factory=list)


def read_runs(runs: Sequence[Path]) -> tuple[dict[str, dict[str, Figures]], list[str]]:
    """``{workload: {contender: Figures}}`` over the runs' ``<workload>/results.json``, and
    the contenders in the order they first appear."""
    found: dict[str, dict[str, Figures]] = {}
    names: list[str] = []
    for run in runs:
        for results in sorted(run.glob("*/results.json")):
            data = json.loads(results.read_text())
            workload = results.parent.name
            for contender in data.get("contenders", []):
                name = contender["name"]
                if name not in names:
                    names.append(name)
                summary = contender.get("summary") or {}
                if contender.get("status") != "ok" or summary.get("hit_rate") is None:
                    continue
                figures = found.setdefault(workload, {}).setdefault(name, Figures())
                figures.hit_rates.append(float(summary["hit_rate"]))
                figures.ttft_p99s.append(float(summary["ttft"]["p99"]))
    return found, names


def is_peer(name: str) -> bool:
    return not name.startswith("prefixgate")


def _p99_cell(figures: Figures | None, best: bool) -> str:
    if figures is None or not figures.ttft_p99s:
        return "-"
    values = figures.ttft_p99s
    text = f"{statistics.median(values) * 1000:.1f}"
    if len(values) > 1:
        text += f" ({min(values) * 1000:.1f}-{max(values) * 1000:.1f})"
    return f"**{text}**" if best else text


def _hit_cell(figures: Figures | None) -> str:
    if figures is None or not figures.hit_rates:
        return "-"
    return f"{statistics.median(figures.hit_rates) * 100:.1f}"


def report(found: dict[str, dict[str, Figures]], names: Sequence[str], subject: str,
           runs: int) -> str:
    """The Markdown report: one row per workload, the verdict last."""
    header = ["workload", "runs",
              *(f"hit rate %: {n}" for n in names),
              *(f"TTFT p99 ms: {n}" for n in names),
              f"{subject} p99 vs best peer"]
    rows = []
    met = judged = 0
    for workload in sorted(found):
        by_name = found[workload]
        medians = {n: statistics.median(f.ttft_p99s) for n, f in by_name.items() if f.ttft_p99s}
        fastest = min(medians.values()) if medians else None
        peers = [medians[n] for n in medians if is_peer(n)]
        verdict = "-"
        if subject in medians and peers:
            best_peer = min(peers)
            ratio = medians[subject] / best_peer
            judged += 1
            met += ratio <= 1.0
            verdict = f"{ratio:.2f}x ({'at or under' if ratio <= 1.0 else 'over'})"
        counted = max((len(f.ttft_p99s) for f in by_name.values()), default=0)
        rows.append([workload, str(counted),
                     *(_hit_cell(by_name.get(n)) for n in names),
                     *(_p99_cell(by_name.get(n), medians.get(n) == fastest) for n in names),
                     verdict])
    lines = [(f"Medians over {runs} runs (TTFT p99: median, then the runs' range; "
             "bold: the fastest median)."), "", table(header, rows), ""]
    if judged:
        lines.append(f"{subject}: median TTFT p99 at or under the best peer's on "
                     f"{met} of {judged} workloads.")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.medians", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="the runs' output folders")
    parser.add_argument("--subject", help="the contender judged against the peers "
                        "(default: the first prefixgate contender)")
    args = parser.parse_args(argv)
    missing = [str(r) for r in args.runs if not r.is_dir()]
    if missing:
        parser.error(f"not a folder: {', '.join(missing)}")
    found, names = read_runs(args.runs)
    if not found:
        print(f"no <workload>/results.json under {', '.join(map(str, args.runs))}",
              file=sys.stderr)
        return 1
    subject = args.subject or next((n for n in names if not is_peer(n)), names[0])
    if subject not in names:
        parser.error(f"--subject {subject} is not a contender of these runs: {', '.join(names)}")
    sys.stdout.write(report(found, names, subject, len(args.runs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
