"""The plot of ``prefixgate replay --plot``: TTFT at the quantile against the replica count.

matplotlib is the ``loadtest`` extra's (``pip install 'prefixgate[loadtest]'``);
this module is imported only when a plot is asked for. Built on
``matplotlib.figure.Figure`` directly, as ``loadtest.plots`` (no pyplot, no
backend switch). Replays stopped early (certain misses) are drawn as open
markers on the target line; the answer, when there is one, as a dotted vertical
line. Every count replayed has a tick; the labels are spaced by matplotlib's
integer locator, since a bisection's counts (20, 21, 22) sit too close to
label each.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from gateway.replay.search import Question


def draw(series: Sequence[tuple[int, float | None, float | None, bool]],
         question: Question | None, path: Path, title: str, answer: int | None = None
         ) -> Figure:
    """Writes the plot to ``path``; returns the figure (for tests)."""
    quantile = f"p{question.quantile * 100:g}" if question else "p99"
    fig = Figure(figsize=(7, 4.2), dpi=100)
    ax = fig.subplots()
    done = [(n, q, p50 if p50 is not None else q) for n, q, p50, stopped in series
            if not stopped and q is not None]
    if done:
        ax.plot([n for n, _, _ in done], [q for _, q, _ in done], "o-", color="#3949ab",
                label=f"TTFT {quantile}")
        ax.plot([n for n, _, _ in done], [p50 for _, _, p50 in done], "s--", color="#8e99c8",
                label="TTFT p50", markersize=4)
    if question is not None:
        ax.axhline(question.ttft_limit_s, color="#c62828", linewidth=1,
                   label=f"target {question.ttft_limit_s:g} s")
        stopped = [n for n, _, _, was_stopped in series if was_stopped]
        if stopped:
            ax.plot(stopped, [question.ttft_limit_s] * len(stopped), "o", mfc="none",
                    color="#c62828", label=f"{quantile} over the target (stopped early)")
    if answer is not None:
        ax.axvline(answer, color="#2e7d32", linestyle=":", linewidth=1.5,
                   label=f"answer: {answer} replicas")
    ax.set_yscale("log")
    ax.set_xlabel("replicas")
    ax.set_ylabel("time to first token (s)")
    ax.set_xticks(sorted({n for n, _, _, _ in series}), minor=True)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    return fig
