"""Writes a benchmark's outputs: ``results.json``, ``results.md``, ``requests.jsonl``.

``results.json`` holds every figure (the run's metadata, the ideal bound and,
per contender, the full :class:`~.summary.RunSummary` or its ``unavailable``
reason, and the load samples ``[seconds, load of replica 0, 1, ...]``); ``requests.jsonl`` one line per request (kept out of the committed
results: it grows with the workload); ``results.md`` the table a person
reads, one row per contender:

| column | meaning |
|---|---|
| hit rate | replica-side prefix-cache hit tokens / queried tokens |
| of bound | hit rate / the ideal single-cache bound (see ``bound``) |
| TTFT p50 / p99 | time to first content token, milliseconds |
| req/s | successful requests per second of wall time |
| max/mean load | busiest replica's time-averaged load over the average |
| requests per replica | as counted by the replicas |
| errors | failed requests (+ abandoned turns, + unsent past the time limit) |

A run of the ``burst`` workload adds a second table, per contender: the
worst burst's busiest replica over the mean, each burst's requests per
replica, the cached tokens the replicas reported, the gateway's predicted
over those (``x-prefixgate-matched-tokens``), and its breaker openings.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from loadtest import markdown
from loadtest.results import ContenderResult

HEADER = ("contender", "hit rate", "of bound", "TTFT p50 ms", "TTFT p99 ms", "req/s",
          "max/mean load", "requests per replica", "errors")


def _row(result: ContenderResult, bound: float | None) -> list[str]:
    summary = result.summary
    if summary is None:
        reason = (result.unavailable or "").splitlines()[0][:160]
        return [result.name, f"unavailable: {reason}"] + [""] * (len(HEADER) - 2)
    of_bound = (summary.hit_rate / bound) if (summary.hit_rate is not None and bound) else None
    shares = "/".join(f"{r.requests:.0f}" for r in summary.replicas) or markdown.MISSING
    errors = str(summary.errors)
    if summary.abandoned or summary.unsent:
        errors += f" (+{summary.abandoned} abandoned, +{summary.unsent} unsent)"
    return [result.name, markdown.pct(summary.hit_rate), markdown.pct(of_bound),
            markdown.ms(summary.ttft.p50), markdown.ms(summary.ttft.p99),
            markdown.num(summary.throughput_rps, 2), markdown.num(summary.max_mean_load, 2),
            shares, errors]


def markdown_table(results: Sequence[ContenderResult], bound: float | None) -> str:
    return markdown.table(HEADER, (_row(result, bound) for result in results))


BURST_HEADER = ("contender", "worst burst max/mean", "requests per replica, per burst",
                "cached tokens", "predicted/actual", "breaker openings", "TTFT p99 ms")


def _burst_row(result: ContenderResult) -> list[str]:
    summary = result.summary
    if summary is None:
        return [result.name, "unavailable"] + [""] * (len(BURST_HEADER) - 2)
    cached = sum(r.prefix_hits for r in summary.replicas)
    shares = " · ".join("/".join(str(n) for n in burst) for burst in summary.bursts)
    ejections = (markdown.MISSING if summary.ejections is None
                 else f"{summary.ejections:.0f}")
    return [result.name, markdown.num(summary.burst_max_mean, 2), shares or markdown.MISSING,
            f"{cached:,.0f}", markdown.num(summary.predicted_ratio, 2), ejections,
            markdown.ms(summary.ttft.p99)]


def burst_table(results: Sequence[ContenderResult]) -> str:
    """The burst figures, or "" when no contender ran bursts."""
    if not any(r.summary is not None and r.summary.bursts for r in results):
        return ""
    return "\n### Bursts\n\n" + markdown.table(BURST_HEADER, (_burst_row(r) for r in results))


def results_document(meta: dict[str, Any], results: Sequence[ContenderResult],
                     bound: float | None) -> dict[str, Any]:
    contenders = []
    for result in results:
        summary = result.summary
        contenders.append({
            "name": result.name,
            "status": "ok" if summary is not None else "unavailable",
            "unavailable": result.unavailable,
            "note": result.note,
            "of_bound": (summary.hit_rate / bound)
            if summary is not None and summary.hit_rate is not None and bound else None,
            "summary": summary.to_dict() if summary is not None else None,
            "load_samples": [[round(s.at, 3), *s.load] for s in result.run.load]
            if result.run is not None else [],
        })
    return {"meta": meta, "bound_hit_rate": bound, "contenders": contenders}


def write_outputs(out_dir: Path, meta: dict[str, Any], results: Sequence[ContenderResult],
                  bound: float | None, title: str) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "results.json", "md": out_dir / "results.md",
             "requests": out_dir / "requests.jsonl"}
    document = results_document(meta, results, bound)
    paths["json"].write_text(json.dumps(document, indent=2, sort_keys=False) + "\n")
    with paths["requests"].open("w") as handle:
        for result in results:
            if result.run is None:
                continue
            for record in result.run.drive.records:
                handle.write(json.dumps({"contender": result.name, **asdict(record)}) + "\n")
    bound_line = (f"Ideal bound (one cache holding all replicas' capacity): "
                  f"{markdown.pct(bound)}\n\n" if bound is not None else "")
    notes = "".join(f"- {r.name}: {r.note}\n" for r in results if r.note)
    unavailable = "".join(
        f"\n### {r.name} unavailable\n\n```\n{r.unavailable}\n```\n"
        for r in results if r.unavailable)
    markdown.write(paths["md"], bound_line + markdown_table(results, bound)
                   + burst_table(results)
                   + (f"\nNotes:\n{notes}" if notes else "") + unavailable, title)
    return paths
