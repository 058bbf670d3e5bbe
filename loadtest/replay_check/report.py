"""The check's results folder: ``results.json``, ``results.md`` and ``replay-check.png``.

The plot has one panel per figure (hit rate, TTFT p50, TTFT p99) and a pair
of bars per scenario: what the real replicas did, what the replay of the
base recording predicted.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from loadtest import markdown
from loadtest.replay_check.verdict import FLAT_POINTS, FLAT_SHARE, HIT_POINTS, METRICS, TTFT_SHARE


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:,.0f} ms"


def _mark(met: bool | None) -> str:
    return {True: "yes", False: "**no**", None: "-"}[met]


def _check_value(metric: str, value: float) -> str:
    if metric.startswith("hit rate change"):
        return f"{100 * value:+.1f}"
    if "ratio" in metric:
        return f"{value:.2f}x"
    if metric == "hit rate":
        return _pct(value)
    return _ms(value)


def scenario_table(document: dict[str, Any]) -> str:
    rows = []
    for name, item in document["scenarios"].items():
        real = item.get("real") or {}
        predicted = item.get("predicted") or {}
        client = item.get("client") or {}
        rows.append([f"{name} ({item['label']})", _pct(real.get("hit_rate")),
                     _pct(predicted.get("hit_rate")), _ms(real.get("ttft_p50_s")),
                     _ms(predicted.get("ttft_p50_s")), _ms(real.get("ttft_p99_s")),
                     _ms(predicted.get("ttft_p99_s")), _pct(client.get("replica_hit_rate")),
                     _ms(client.get("ttft_p50_s")), _ms(client.get("ttft_p99_s"))])
    return markdown.table(
        ["scenario", "hit rate real", "hit rate replay", "TTFT p50 real", "TTFT p50 replay",
         "TTFT p99 real", "TTFT p99 replay", "replicas' counters hit rate", "client TTFT p50",
         "client TTFT p99"], rows)


def checks_table(checks: Sequence[dict[str, Any]]) -> str:
    rows = [[c["scenario"], c["metric"], _check_value(c["metric"], c["real"]),
             _check_value(c["metric"], c["predicted"]), c["target"], _mark(c["met"]),
             _mark(c.get("direction_met"))] for c in checks]
    return markdown.table(["scenario", "figure", "real", "replay", "target", "size holds",
                           "direction holds"], rows)


def render(document: dict[str, Any]) -> str:
    fit = document.get("fit") or {}
    lines = [
        f"# {document['title']}", "",
        f"Command: `{document['command']}`", "",
        f"Machine: {document['machine_line']}. Date: {document['date']}.", "",
        f"Workload: {document['workload_line']}.", "",
        f"Replicas: {document['replicas_line']}.", "",
        ("Real figures are what the gateway recorded of each real run (its trace: "
         "`cached_tokens` from each replica's `usage`, TTFT from arrival at the gateway to the "
         "first byte back); replay figures are `prefixgate replay` of the *base* recording on "
         "2 simulated replicas with the fitted latency model (TTFT to the simulated engine's "
         "first token plus the model's time outside the engine's steps). Percentiles by the "
         "nearest rank. The client's own view and the replicas' counters are beside them."),
        "",
        scenario_table(document), "",
        (f"Targets: the base replay's hit rate within {HIT_POINTS * 100:g} points and TTFT "
         f"p50 within {TTFT_SHARE:.0%} of the real run's; each what-if's change from the base, "
         "real against predicted, in the same direction (or both flat: under "
         f"{FLAT_POINTS * 100:g} point of hit rate, {FLAT_SHARE:.0%} of TTFT) and of the same "
         f"size (hit rate change within {HIT_POINTS * 100:g} points, TTFT ratio within "
         f"{TTFT_SHARE:.0%}). `repeat` is the base workload run again for real: how far two "
         "real runs of the same thing fall apart here."),
        "",
        checks_table(document["checks"]), "",
    ]
    if fit:
        lines += ["## The fit", "", "```", fit.get("output", "").rstrip(), "```", "",
                  f"Fit command: `{fit.get('command', '')}`", ""]
    lines += ["## Commands", ""]
    for name, item in document["scenarios"].items():
        if item.get("replay_command"):
            lines.append(f"- {name}, replay: `{item['replay_command']}`")
        if item.get("run_seconds") is not None:
            load = ""
            if item.get("loadavg_1m_before") is not None:
                load = (f"; 1-minute load average {item['loadavg_1m_before']:.1f} before, "
                        f"{item['loadavg_1m_after']:.1f} after")
            lines.append(f"- {name}, real run: {item['run_seconds']:.0f} s holding the bench "
                         f"lock (waited {item.get('lock_wait_s', 0):.0f} s for it){load}")
    notes = document.get("notes") or []
    if notes:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"


def plot(document: dict[str, Any], path: Path) -> None:
    scenarios = list(document["scenarios"].items())
    fig = Figure(figsize=(9.5, 3.6), dpi=100)
    axes = fig.subplots(1, 3)
    width = 0.38
    for ax, (metric, label) in zip(axes, METRICS, strict=True):
        scale = 100.0 if metric == "hit_rate" else 1000.0
        xs = range(len(scenarios))
        for offset, side, color in ((-width / 2, "real", "#455a64"),
                                    (width / 2, "predicted", "#3949ab")):
            values = [((item.get(side) or {}).get(metric) or 0.0) * scale
                      for _, item in scenarios]
            ax.bar([x + offset for x in xs], values, width,
                   label="real vLLM" if side == "real" else "replay", color=color)
        ax.set_xticks(list(xs))
        ax.set_xticklabels([name for name, _ in scenarios], fontsize=8)
        ax.set_title(label + (" (%)" if metric == "hit_rate" else " (ms)"), fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].legend(fontsize=8, loc="lower left", framealpha=0.9)
    fig.suptitle(document["title"], fontsize=9)
    fig.tight_layout()
    fig.savefig(path)


def write(document: dict[str, Any], out: Path) -> dict[str, Path]:
    paths = {"json": out / "results.json", "md": out / "results.md",
             "png": out / "replay-check.png"}
    paths["json"].write_text(json.dumps(document, indent=2, default=str) + "\n")
    paths["md"].write_text(render(document))
    plot(document, paths["png"])
    return paths
