"""A seconds-long ``python -m loadtest compare`` produces every output it promises.

Two simulated replicas at a high time-scale, a tiny shared-prefix workload,
and three contenders: prefixgate, one peer router (installed from PyPI into
its cache venv on first use; without network it must appear as an explicit
"unavailable" row instead) and a direct connection. Nothing here is timed:
the test checks that each row is complete, not how fast anything was.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[2]
CONTENDERS = ["prefixgate:least_load", "sglang-router:cache_aware", "direct:sim0"]


@pytest.fixture(scope="module")
def compare_output(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("compare")
    command = [
        sys.executable, "-m", "loadtest", "compare", "--replicas", "sim:2",
        "--replica-args", "--num-blocks 256 --time-scale 50",
        "--workload", "shared-prefix", "--groups", "3", "--prompts-per-group", "3",
        "--system-len", "64", "--question-len", "8", "--output-len", "4", "--concurrency", "4",
        "--contenders", ",".join(CONTENDERS), "--max-duration", "60", "--out", str(out),
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (out / "stderr.txt").write_text(done.stderr)
    return out


def test_every_contender_has_a_row(compare_output: Path) -> None:
    document = json.loads((compare_output / "results.json").read_text())
    rows = {row["name"]: row for row in document["contenders"]}
    assert list(rows) == CONTENDERS
    for name, row in rows.items():
        if row["status"] == "unavailable":
            assert row["unavailable"], name
            assert not name.startswith(("prefixgate", "direct")), row["unavailable"]
            continue
        summary = row["summary"]
        assert summary["ok"] == 9, (name, summary["error_kinds"])
        assert summary["ttft"]["p50"] > 0
        assert summary["throughput_rps"] > 0
        assert 0.0 <= summary["hit_rate"] <= 1.0
        assert sum(r["requests"] for r in summary["replicas"]) == 9
    assert 0.0 < document["bound_hit_rate"] <= 1.0
    assert document["meta"]["workload"]["requests"] == 9


def test_warm_up_runs_first_and_is_not_counted(compare_output: Path) -> None:
    # The warm-up drives the workload straight at the replicas before the first
    # contender; every contender's replica counters above hold its own 9 requests only.
    log = (compare_output / "stderr.txt").read_text()
    assert "== warm-up" in log
    assert log.index("== warm-up") < log.index(f"== {CONTENDERS[0]}")
    document = json.loads((compare_output / "results.json").read_text())
    assert document["meta"]["warmup_seconds"] == 20.0


def test_gateway_names_the_replica(compare_output: Path) -> None:
    lines = (compare_output / "requests.jsonl").read_text().splitlines()
    routed = [json.loads(line) for line in lines]
    ours = [r for r in routed if r["contender"] == "prefixgate:least_load"]
    assert ours and all(r["replica"] in ("sim0", "sim1") for r in ours)


def test_table_and_plots_are_written(compare_output: Path) -> None:
    table = (compare_output / "results.md").read_text()
    for name in CONTENDERS:
        assert f"| {name} |" in table
    for plot in ("ttft_cdf.png", "hit_rate_per_replica.png", "load_over_time.png"):
        data = (compare_output / plot).read_bytes()
        assert data.startswith(b"\x89PNG"), plot


def test_a_run_against_a_server_that_is_not_there_ends_with_one_line(tmp_path: Path) -> None:
    target = f"http://127.0.0.1:{free_port()}"
    done = subprocess.run(
        [sys.executable, "-m", "loadtest", "run", "--target", target, "--out", str(tmp_path),
         "--workload", "shared-prefix"], cwd=REPO, capture_output=True, text=True,
        timeout=120, check=False)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert f"GET {target}/v1/models: ConnectError" in done.stderr and "--model" in done.stderr
