"""``python -m loadtest replay-check`` end to end, simulated replicas standing in for vLLM.

Four short runs through the real gateway with its trace on (base, twice the
rate, half the KV blocks, the base again), ``prefixgate fit`` reading the replicas during the
first and stopped with SIGTERM, the replays of the base recording, the
results folder. Nothing here is timed: the checks are what a user of the
harness relies on -- every output is written, the recorded file is the
traffic's shape and no text, and a replay with the recorded routing finds in
its engines' caches exactly the tokens the replicas reported cached (the
caches are large enough that nothing is evicted, so this holds whatever the
timing).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def check(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("replay-check")
    command = [
        sys.executable, "-m", "loadtest", "replay-check", "--replicas", "sim", "--no-lock",
        "--blocks", "200", "--sim-args", "--step-overhead 0.02 --prefill-per-token 0.0001",
        "--fit-interval", "0.5", "--workload", "shared-prefix", "--groups", "3",
        "--prompts-per-group", "4", "--system-len", "128", "--question-len", "8",
        "--output-len", "4", "--rate", "6", "--max-duration", "60", "--out", str(out),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def test_every_output_is_written_and_every_scenario_has_both_sides(check: Path) -> None:
    for name in ("results.md", "results.json", "replay-check.png", "base/model.json",
                 "base/readings.jsonl", "base/trace.jsonl", "rate-2x/trace.jsonl",
                 "kv-half/trace.jsonl", "repeat/trace.jsonl"):
        assert (check / name).stat().st_size > 0, name
    document = json.loads((check / "results.json").read_text())
    scenarios = document["scenarios"]
    # `repeat` is the base run again for real: the noise floor, predicted by the base's replay
    assert set(scenarios) == {"base", "rate-2x", "kv-half", "repeat", "recorded"}
    for name, item in scenarios.items():
        assert item["real"]["requests"] == 12 and item["predicted"]["requests"] == 12, name
        if name != "repeat":
            assert item["replay_command"].startswith("prefixgate replay "), name
    assert "replay_command" not in scenarios["repeat"]
    assert {c["scenario"] for c in document["checks"]} == {"base", "rate-2x", "kv-half", "repeat"}
    model = json.loads((check / "base" / "model.json").read_text())
    assert model["format"] == "prefixgate-latency-model/1" and model["num_blocks"] == 200
    assert "## The fit" in (check / "results.md").read_text()


def test_the_recording_is_the_traffics_shape_and_holds_no_prompt_text(check: Path) -> None:
    fields = {"timestamp", "input_length", "output_length", "hash_ids", "block_size", "model",
              "replica", "policy", "stream", "ttft_ms", "cached_tokens", "session"}
    for scenario in ("base", "rate-2x", "kv-half"):
        lines = (check / scenario / "trace.jsonl").read_text().splitlines()
        assert len(lines) == 12
        for line in lines:
            record = json.loads(line)
            assert set(record) <= fields
            strings = {v for v in record.values() if isinstance(v, str)}
            assert strings <= {"sim-model", "sim0", "sim1", "prefix"}, strings
            assert all(isinstance(h, int) for h in record["hash_ids"])
            assert len(record["hash_ids"]) == record["input_length"] // 32


def test_replayed_with_the_recorded_routing_the_engines_hit_what_the_replicas_did(
        check: Path) -> None:
    recorded = json.loads((check / "replay-recorded.json").read_text())
    assert recorded["recorded"]["hit_rate"] > 0.3  # the apps' prompts were reused
    assert recorded["replays"][0]["hit_rate"] == pytest.approx(recorded["recorded"]["hit_rate"],
                                                               abs=1e-9)
