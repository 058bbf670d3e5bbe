"""``python -m loadtest replay-check``'s pure parts: the what-ifs, the verdicts, the wait
for the fit's readings.

The harness itself (real runs, the fit, the replays, the results folder) runs
end to end against simulated replicas in ``tests/integration/test_replay_check.py``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.replay_check.real import _reads, _wait_for_reads
from loadtest.replay_check.scenarios import SCENARIOS, Scenario, replay_argv, scenario_workload
from loadtest.replay_check.verdict import Figures, base_checks, what_if_checks

SHARED = {"groups": 3, "prompts_per_group": 4, "system_len": 64, "question_len": 8,
          "output_len": 4, "rate": 2.0}


def test_twice_the_rate_sends_the_same_requests_at_half_the_times() -> None:
    base = scenario_workload("shared-prefix", SHARED, SCENARIOS[0])
    faster = scenario_workload("shared-prefix", SHARED, Scenario("x", "x", speed=2.0))
    assert [c.id for c in faster.conversations] == [c.id for c in base.conversations]
    for fast, slow in zip(faster.conversations, base.conversations, strict=True):
        assert fast.turns == slow.turns
        assert fast.arrival == pytest.approx(slow.arrival / 2)
    with pytest.raises(ValueError, match="open-loop"):
        scenario_workload("shared-prefix", {**SHARED, "rate": None},
                          Scenario("x", "x", speed=2.0))


def test_each_what_if_replays_the_base_recording_as_a_user_would() -> None:
    argv = {s.name: replay_argv("t.jsonl", "m.json", s, 320, "o.json") for s in SCENARIOS}
    assert argv["base"][:2] == ["prefixgate", "replay"] and "--speed" not in argv["base"]
    assert argv["rate-2x"][argv["rate-2x"].index("--speed") + 1] == "2"
    assert argv["kv-half"][argv["kv-half"].index("--blocks") + 1] == "160"
    assert all(a[a.index("--replicas") + 1] == "2" for a in argv.values())


def test_the_base_replay_is_judged_on_hit_rate_points_and_ttft_share() -> None:
    real = Figures(100, 0.80, 0.100, 0.500)
    close = {c.metric: c for c in base_checks(real, Figures(100, 0.815, 0.118, 0.9))}
    assert close["hit rate"].met and close["TTFT p50"].met and close["TTFT p99"].met is None
    far = {c.metric: c for c in base_checks(real, Figures(100, 0.775, 0.079, 0.5))}
    assert not far["hit rate"].met and not far["TTFT p50"].met


def test_a_what_if_holds_when_direction_and_size_of_the_change_agree() -> None:
    real_base, sim_base = Figures(100, 0.80, 0.100, 0.400), Figures(100, 0.79, 0.110, 0.380)
    real = Figures(100, 0.60, 0.150, 0.800)
    good = {c.metric: c for c in what_if_checks("kv", real_base, real, sim_base,
                                                 Figures(100, 0.60, 0.170, 0.700))}
    hit = good["hit rate change (points)"]
    assert hit.real == pytest.approx(-0.20) and hit.predicted == pytest.approx(-0.19)
    assert hit.met and hit.direction_met
    assert good["TTFT p50 ratio to base"].met and good["TTFT p50 ratio to base"].direction_met
    wrong_way = {c.metric: c for c in what_if_checks("kv", real_base, real, sim_base,
                                                      Figures(100, 0.80, 0.090, 0.300))}
    assert not wrong_way["hit rate change (points)"].met
    assert not wrong_way["hit rate change (points)"].direction_met
    assert not wrong_way["TTFT p50 ratio to base"].direction_met
    # Both flat: the direction holds whatever the sign of the noise.
    flat = {c.metric: c for c in what_if_checks(
        "rate", real_base, Figures(100, 0.803, 0.102, 0.41), sim_base,
        Figures(100, 0.788, 0.109, 0.385))}
    assert flat["hit rate change (points)"].direction_met
    assert flat["TTFT p50 ratio to base"].direction_met


def test_the_fit_is_waited_for_until_it_has_read_the_replicas(tmp_path: Path) -> None:
    log = tmp_path / "fit.log"
    assert _reads(log) == 0  # no log yet: nothing read
    log.write_bytes(b"reading 2 replicas\n  read 2 times, 1/60 s\n  read 4 times, 2/60 s\n")
    assert _reads(log) == 4
    append = f"open({str(log)!r}, 'ab').write(b'  read 6 times, 3/60 s\\n')"
    writer = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(0.3); {append}"])
    _wait_for_reads(writer, log, 6, timeout=30.0)
    writer.wait()
    assert _reads(log) == 6
    # a fit that exits before reading enough is an error, not a wait until the timeout
    gone = subprocess.Popen([sys.executable, "-c", "raise SystemExit(2)"])
    gone.wait()
    with pytest.raises(RuntimeError, match="exited with 2"):
        _wait_for_reads(gone, log, 8, timeout=30.0)
