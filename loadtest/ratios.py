"""``python -m loadtest.ratios BASELINE DIR ...``: each contender of compare runs as
ratios to one of them, a table per run folder (``DIR/results.json``).

Hit rate (the replicas' own counters) and TTFT p50/p99 of every contender
over the baseline's (e.g. ``prefixgate:prefix``: one gateway), so a suite
that compares deployments of the same router (one instance, two sharing
state, two on their own) reads as "what is kept, what is lost".
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtest import markdown

HEADER = ("workload", "contender", "hit rate", "x hit rate", "TTFT p50 ms", "x p50",
          "TTFT p99 ms", "x p99", "errors")


def _ratio(value: float | None, base: float | None) -> str:
    return markdown.num(value / base, 3) if value is not None and base else markdown.MISSING


def rows(document: dict[str, Any], baseline: str) -> list[list[str]]:
    workload = document["meta"]["workload"]["name"]
    summaries = {c["name"]: c["summary"] for c in document["contenders"] if c["summary"]}
    base = summaries.get(baseline)
    if base is None:
        raise ValueError(f"{workload}: no measured contender {baseline!r}")
    out = []
    for name, summary in summaries.items():
        out.append([workload, name, markdown.pct(summary["hit_rate"]),
                    _ratio(summary["hit_rate"], base["hit_rate"]),
                    markdown.ms(summary["ttft"]["p50"]),
                    _ratio(summary["ttft"]["p50"], base["ttft"]["p50"]),
                    markdown.ms(summary["ttft"]["p99"]),
                    _ratio(summary["ttft"]["p99"], base["ttft"]["p99"]),
                    str(summary["errors"])])
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.ratios", description=__doc__)
    parser.add_argument("baseline", help="the contender the others are divided by")
    parser.add_argument("runs", nargs="+", type=Path, help="compare --out folders")
    args = parser.parse_args(argv)
    table_rows = [row for run in args.runs
                  for row in rows(json.loads((run / "results.json").read_text()), args.baseline)]
    print(markdown.table(HEADER, table_rows), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
