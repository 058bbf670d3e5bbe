"""A seconds-long ``python -m loadtest overhead`` in the open-loop, lean-client mode.

One simulated replica, one gateway and the pass-through control proxy
(``loadtest/null_proxy.py``), a handful of open-loop requests through the
lean client (``loadtest.client.LeanClient``). Nothing is timed: the
test checks that both paths answered every request and that the gateway's
own histograms (added time to first token, event-loop lag) were read back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_open_loop_raw_client_overhead_run(tmp_path: Path) -> None:
    command = [
        sys.executable, "-m", "loadtest", "overhead", "--concurrency", "0", "--rate", "20",
        "--requests", "12", "--rounds", "1", "--prompt-len", "256", "--output-len", "6",
        "--distinct-prompts", "8", "--time-scale", "20", "--client", "raw",
        "--policy", "prefix", "--null-proxy", "--out", str(tmp_path),
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    document = json.loads((tmp_path / "overhead.json").read_text())
    assert document["meta"]["client"] == "raw" and document["meta"]["rate"] == 20
    paths = {path["name"]: path for path in document["paths"]}
    assert set(paths) == {"direct", "null-proxy", "prefixgate:prefix"}
    for path in paths.values():
        assert path["requests"] == 12 and path["errors"] == 0
        assert path["ttft_p50_ms"] > 0 and path["mean_in_flight"] > 0
        # every request was joined to the replica's timing log by its id
        assert path["timed"] == 12 and 0 < path["outside_p50_ms"] < path["ttft_p50_ms"]
    gateway = paths["prefixgate:prefix"]
    assert gateway["added_ttft_p50_ms"] is not None and gateway["added_ttft_p50_ms"] > 0
    assert gateway["loop_lag_p99_ms"] is not None  # the event-loop probe was read back
    assert gateway["outside_overhead_p50_ms"] is not None
    assert gateway["gc_pauses"] and gateway["gc_pauses"] > 0  # its collections were timed
    assert gateway["over_null_p50_ms"] is not None  # compared with the pass-through proxy
    # each proxy process's CPU time over its rounds was read from /proc (not the direct path)
    assert paths["null-proxy"]["cpu_ms_per_request"] is not None
    assert paths["direct"]["cpu_ms_per_request"] is None
    assert gateway["cpu_ms_per_request"] > 0
    # /proc counts CPU in ticks (100 a second): a 12-request round of the null proxy
    # can read as none, and then there is no ratio to give rather than a wrong one
    null_cpu = paths["null-proxy"]["cpu_ms_per_request"]
    assert (gateway["cpu_over_null"] is not None) == (null_cpu > 0)
    if null_cpu > 0:
        assert gateway["cpu_over_null"] == pytest.approx(gateway["cpu_ms_per_request"] / null_cpu)
    assert "in-gateway added TTFT" in (tmp_path / "overhead.md").read_text()
