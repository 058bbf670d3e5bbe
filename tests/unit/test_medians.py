"""python -m loadtest.medians: the suite's repeated runs summed up per workload."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest.medians import main


def _run(folder: Path, workload: str, contenders: list[tuple[str, str, float, float]]) -> None:
    (folder / workload).mkdir(parents=True)
    (folder / workload / "results.json").write_text(json.dumps({"contenders": [
        {"name": name, "status": status,
         "summary": {"hit_rate": hit, "ttft": {"p99": p99}} if status == "ok" else None}
        for name, status, hit, p99 in contenders]}))


def test_medians_judge_the_subject_against_the_best_peer(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    _run(tmp_path / "run-1", "rag", [("prefixgate:default", "ok", 0.90, 0.100),
                                     ("sglang-router:cache_aware", "ok", 0.80, 0.150)])
    _run(tmp_path / "run-2", "rag", [("sglang-router:cache_aware", "ok", 0.82, 0.250),
                                     ("prefixgate:default", "ok", 0.92, 0.300)])
    _run(tmp_path / "run-3", "rag", [("prefixgate:default", "ok", 0.91, 0.160),
                                     ("sglang-router:cache_aware", "failed", 0.0, 0.0)])
    _run(tmp_path / "run-1", "agent", [("prefixgate:default", "ok", 0.5, 0.400),
                                       ("vllm-router:cache_aware", "ok", 0.5, 0.200)])
    assert main([str(tmp_path / f"run-{i}") for i in (1, 2, 3)]) == 0
    out = capsys.readouterr().out
    rag = next(line for line in out.splitlines() if line.startswith("| rag"))
    # default: median of 100, 300, 160 ms; sglang-router: of 150 and 250 (its failed run left out)
    assert "**160.0 (100.0-300.0)**" in rag and "200.0 (150.0-250.0)" in rag
    assert "91.0" in rag and "81.0" in rag  # median hit rates
    assert "0.80x (at or under)" in rag
    agent = next(line for line in out.splitlines() if line.startswith("| agent"))
    assert "2.00x (over)" in agent
    assert "at or under the best peer's on 1 of 2 workloads" in out


def test_an_empty_folder_is_said_not_summed(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path)]) == 1
    assert "no <workload>/results.json" in capsys.readouterr().err
