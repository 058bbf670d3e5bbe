"""PNG plots of a benchmark (matplotlib, Agg backend: no display needed).

* ``ttft_cdf.png``: cumulative distribution of TTFT, one line per contender
  (log-scaled time axis; the further left and steeper, the better);
* ``hit_rate_per_replica.png``: replica-side prefix-cache hit rate of each
  replica, grouped by contender, with the ideal bound as a dashed line;
* ``load_over_time.png``: running + waiting requests of each replica over
  the run, one panel per contender (an even router draws overlapping lines).

Figures are built on ``matplotlib.figure.Figure`` directly (no pyplot, so no
global figure registry or backend switch at import time; ``savefig`` renders
with Agg). They are kept small (~100 dpi) so they can be committed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter, ScalarFormatter

from loadtest.results import ContenderResult


def _measured(results: Sequence[ContenderResult]) -> list[ContenderResult]:
    return [r for r in results if r.run is not None]


_STYLES = {"prefixgate": "-", "vllm-router": "--", "sglang-router": ":", "direct": "-."}


def _style(name: str) -> str:
    """One line style per kind of contender, so 10+ lines stay tellable apart."""
    return _STYLES.get(name.partition(":")[0], "-")


def ttft_cdf(results: Sequence[ContenderResult], path: Path, title: str) -> None:
    fig = Figure(figsize=(7, 4.2), dpi=100)
    ax = fig.subplots()
    for result in _measured(results):
        assert result.run is not None
        values = sorted(r.ttft * 1000 for r in result.run.drive.records if r.ok and r.ttft)
        if not values:
            continue
        ys = [(i + 1) / len(values) for i in range(len(values))]
        ax.step(values, ys, where="post", label=result.name, linewidth=1.2,
                linestyle=_style(result.name))
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("time to first token (ms, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)


def hit_rate_per_replica(results: Sequence[ContenderResult], path: Path, title: str,
                         bound: float | None) -> None:
    measured = [r for r in _measured(results) if r.summary is not None]
    fig = Figure(figsize=(max(6.0, 0.9 * len(measured) + 2), 4.2), dpi=100)
    ax = fig.subplots()
    replica_count = max((len(r.summary.replicas) for r in measured if r.summary), default=0)
    width = 0.8 / max(replica_count, 1)
    for index in range(replica_count):
        xs, ys = [], []
        for position, result in enumerate(measured):
            assert result.summary is not None
            replicas = result.summary.replicas
            if index < len(replicas):
                xs.append(position + (index - (replica_count - 1) / 2) * width)
                ys.append((replicas[index].hit_rate or 0.0) * 100)
        ax.bar(xs, ys, width=width, label=f"replica {index}")
    if bound is not None:
        ax.axhline(bound * 100, linestyle="--", color="black", linewidth=1, label="ideal bound")
    ax.set_xticks(range(len(measured)))
    ax.set_xticklabels([r.name for r in measured], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("prefix-cache hit rate (%)")
    ax.set_ylim(0, 100)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)


def load_over_time(results: Sequence[ContenderResult], path: Path, title: str) -> None:
    measured = [r for r in _measured(results) if r.run is not None and r.run.load]
    if not measured:
        return
    columns = 2 if len(measured) > 1 else 1
    rows = (len(measured) + columns - 1) // columns
    fig = Figure(figsize=(7 * columns / 1.4, 2.0 * rows + 0.6), dpi=72)
    axes = fig.subplots(rows, columns, squeeze=False, sharex=True)
    for ax, result in zip(axes.flat, measured):
        assert result.run is not None
        times = [s.at for s in result.run.load]
        for index in range(len(result.run.replica_urls)):
            ax.plot(times, [s.load[index] for s in result.run.load], linewidth=0.9,
                    label=f"replica {index}")
        ax.set_title(result.name, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[len(measured):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6)
    fig.supxlabel("seconds since start", fontsize=8)
    fig.supylabel("running + waiting", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)


def write_plots(out_dir: Path, results: Sequence[ContenderResult], title: str,
                bound: float | None) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "ttft_cdf.png", out_dir / "hit_rate_per_replica.png",
             out_dir / "load_over_time.png"]
    ttft_cdf(results, paths[0], f"TTFT — {title}")
    hit_rate_per_replica(results, paths[1], f"Hit rate per replica — {title}", bound)
    load_over_time(results, paths[2], f"Load per replica — {title}")
    return [p for p in paths if p.exists()]
