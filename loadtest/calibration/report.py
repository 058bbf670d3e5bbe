"""Calibration outputs: ``calibration.json``, a Markdown table, a small PNG.

* JSON: the command line and machine, the target, the plan, every raw
  measurement of the real engine and of each simulator round, the per-point
  medians, the fits (joint, per probe, per round), the chosen parameters with
  their ``prefixgate sim`` flags, and the comparison of the chosen round.
* Markdown: fitted parameters and flags, then one row per probe point (real
  and simulated median, relative error, the real samples the median used and
  the median share of the engine's core other processes took) and one per
  probe (median and max absolute error).
* PNG (matplotlib ``Figure``, no pyplot; 90 dpi): TTFT vs prompt tokens
  (cold and cached, real as dots, simulator as crosses) and TPOT vs batch
  size.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from loadtest import markdown
from loadtest.calibration.model import PARAM_NAMES, FitResult
from loadtest.calibration.points import PointSummary
from loadtest.calibration.probes import CACHED, DECODE, PREFILL
from loadtest.calibration.result import Calibration

_LABELS = {PREFILL: "prefill TTFT", CACHED: "cached TTFT", DECODE: "decode TPOT"}


def _fit_json(result: FitResult) -> dict[str, Any]:
    params = dataclasses.asdict(result.params)
    return {
        "probes": list(result.probes),
        "params": params,
        "flags": result.params.flag_text(),
        "rms_relative_residual": round(result.rms_relative_residual, 4),
        "points": result.points,
    }


def to_json(calibration: Calibration, command: str, machine: dict[str, Any]) -> dict[str, Any]:
    best = calibration.best
    return {
        "command": command,
        "machine": machine,
        "target": dataclasses.asdict(calibration.target),
        "tokenizer": calibration.tokenizer,
        "max_foreign_cpu": calibration.max_foreign,
        "limits": dataclasses.asdict(calibration.limits),
        "plan": dataclasses.asdict(calibration.plan),
        "fitted": {
            "params": dataclasses.asdict(best.fit.params),
            "flags": best.fit.params.flag_text(),
            "round": best.index,
        },
        "comparison": {
            "points": [
                {**dataclasses.asdict(p), "relative_error": round(p.relative, 4)}
                for p in best.comparison.points
            ],
            "probes": [dataclasses.asdict(p) for p in best.comparison.probes],
            "rms_relative_error_fitted_probes": round(best.comparison.score(), 4),
        },
        "real": {
            "seconds": round(calibration.real_seconds, 1),
            "points": [dataclasses.asdict(p) for p in calibration.real_points],
            "raw": dataclasses.asdict(calibration.real),
        },
        "diagnostic_fits": {k: _fit_json(v) for k, v in calibration.diagnostics.items()},
        "rounds": [
            {
                "index": r.index,
                "fit": _fit_json(r.fit),
                "seconds": round(r.seconds, 1),
                "rms_relative_error": round(r.comparison.score(), 4),
                "probes": [dataclasses.asdict(p) for p in r.comparison.probes],
                "points": [dataclasses.asdict(p) for p in r.points],
                "raw": dataclasses.asdict(r.results),
            }
            for r in calibration.rounds
        ],
    }


def write_json(document: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1) + "\n")


def _point_label(probe: str, x: int) -> str:
    return f"C={x}" if probe == DECODE else f"{x} tokens"


def markdown_report(calibration: Calibration) -> str:
    best = calibration.best
    params = best.fit.params
    head = [
        (
            f"Target: {calibration.target.kind} `{calibration.target.model}`; "
            f"chosen: round {best.index} of {len(calibration.rounds)}"
        ),
        "",
        markdown.table(("parameter", "fitted"),
                       ((f"`{name}`", f"{getattr(params, name):.6g}") for name in PARAM_NAMES)),
        f"`prefixgate sim {params.flag_text()}`",
        "",
        *_contention_note(calibration),
    ]
    real_by_key = {(p.probe, p.x): p for p in calibration.real_points}
    rows = []
    for point in best.comparison.points:
        real = real_by_key[(point.probe, point.x)]
        rows.append((_LABELS[point.probe], _point_label(point.probe, point.x),
                     markdown.ms(point.real, 2), markdown.ms(point.sim, 2),
                     markdown.pct(point.relative, sign=True),
                     f"{real.samples}/{real.samples + real.discarded}",
                     markdown.pct(real.foreign_cpu, 0)))
    points = markdown.table(("probe", "point", "real ms", "sim ms", "error", "real samples used",
                             "core to others"), rows)
    probes = markdown.table(("probe", "metric", "median abs error", "max abs error"), (
        (probe.probe, probe.metric, markdown.pct(probe.median_abs), markdown.pct(probe.max_abs))
        for probe in best.comparison.probes))
    return "\n".join(head) + "\n" + points + "\n" + probes


def _contention_note(calibration: Calibration) -> list[str]:
    shares = [p.foreign_cpu for p in calibration.real_points if p.foreign_cpu is not None]
    limit = calibration.max_foreign if calibration.max_foreign is not None else 0.25
    if not shares or statistics.median(shares) <= limit:
        return []
    note = (
        f"**Contended:** other processes took a median {statistics.median(shares):.0%} of the "
        "engine's core while the real engine was measured; these numbers describe a shared "
        "core, not the engine."
    )
    return [note, ""]


def _series(points: Sequence[PointSummary], probe: str) -> tuple[list[float], list[float]]:
    chosen = [p for p in points if p.probe == probe]
    return [float(p.x) for p in chosen], [p.value * 1000 for p in chosen]


def plot(calibration: Calibration, path: Path) -> None:
    best = calibration.best
    fig = Figure(figsize=(8, 3.2), dpi=90)
    ttft_ax, tpot_ax = fig.subplots(1, 2)
    for probe, color in ((PREFILL, "tab:blue"), (CACHED, "tab:green")):
        xs, ys = _series(calibration.real_points, probe)
        ttft_ax.plot(xs, ys, "o", color=color, label=f"real {probe}")
        xs, ys = _series(best.points, probe)
        ttft_ax.plot(xs, ys, "x--", color=color, label=f"sim {probe}")
    ttft_ax.set_xlabel("prompt tokens (cached: only the last block computed)")
    ttft_ax.set_ylabel("TTFT, median (ms)")
    ttft_ax.legend(fontsize=7)
    xs, ys = _series(calibration.real_points, DECODE)
    tpot_ax.plot(xs, ys, "o", color="tab:red", label="real")
    xs, ys = _series(best.points, DECODE)
    tpot_ax.plot(xs, ys, "x--", color="tab:red", label="sim")
    tpot_ax.set_xlabel("concurrent streams")
    tpot_ax.set_ylabel("TPOT, median (ms)")
    tpot_ax.legend(fontsize=7)
    for ax in (ttft_ax, tpot_ax):
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    fig.suptitle(f"{calibration.target.model}: real vs calibrated simulator", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
