"""lm-eval-harness as an optional extra: its results read, its absence said plainly."""

from __future__ import annotations

import importlib.util
import io
import sys
from pathlib import Path

import pytest

from gateway.kv.lmeval import (
    LmEvalSettings,
    LmEvalUnavailable,
    command,
    find_python,
    parse_results,
    task_checks,
)
from gateway.kv.quality_cli import run as main
from gateway.kv.quality_probe import Endpoint

# The shape of lm-eval 0.4's results_<timestamp>.json (figures made up).
RESULTS_BASE = {"results": {
    "hellaswag": {"alias": "hellaswag", "acc,none": 0.41, "acc_stderr,none": 0.02,
                  "acc_norm,none": 0.52, "acc_norm_stderr,none": 0.02},
    "mmlu": {"alias": "mmlu", "acc,none": 0.30, "acc_stderr,none": 0.01, "sample_len": 1000},
}}
RESULTS_CAND = {"results": {
    "hellaswag": {"acc,none": 0.40, "acc_norm,none": 0.50},
    "mmlu": {"acc,none": 0.297},
}}


def test_results_are_read_per_task_without_stderr() -> None:
    assert parse_results(RESULTS_BASE) == {"hellaswag": {"acc": 0.41, "acc_norm": 0.52},
                                           "mmlu": {"acc": 0.30}}


def test_each_task_is_judged_on_its_preferred_metric() -> None:
    checks = task_checks(parse_results(RESULTS_BASE), parse_results(RESULTS_CAND))
    assert [(c.name, c.kind) for c in checks] == [("hellaswag:acc_norm", "lm-eval"),
                                                  ("mmlu:acc", "lm-eval")]
    assert checks[0].relative_drop == pytest.approx(0.02 / 0.52)  # 3.8%: fails the 3% rule
    assert checks[1].relative_drop == pytest.approx(0.01)


def test_the_command_points_local_completions_at_the_endpoint_offline() -> None:
    settings = LmEvalSettings(tasks=("hellaswag", "mmlu"), tokenizer="/models/smollm2",
                              include_path="/data/tasks", limit=100)
    argv = command("/venv/bin/python", Endpoint("http://127.0.0.1:9000", "smollm2:kv-fp8"),
                   settings, Path("/tmp/out"))
    assert argv[:6] == ["/venv/bin/python", "-m", "lm_eval", "--model", "local-completions",
                        "--model_args"]
    assert "base_url=http://127.0.0.1:9000/v1/completions" in argv[6]
    assert "model=smollm2:kv-fp8" in argv[6] and "tokenizer=/models/smollm2" in argv[6]
    assert argv[argv.index("--tasks") + 1] == "hellaswag,mmlu"
    assert argv[argv.index("--include_path") + 1] == "/data/tasks"
    assert argv[argv.index("--limit") + 1] == "100"


@pytest.mark.skipif(importlib.util.find_spec("lm_eval") is not None,
                    reason="lm-eval is installed here")
def test_without_lm_eval_the_gate_says_so_and_exits_2(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    with pytest.raises(LmEvalUnavailable, match="pip install 'lm-eval"):
        find_python(None)
    with pytest.raises(LmEvalUnavailable, match="not importable"):
        find_python(sys.executable)
    code = main(["--baseline", "http://127.0.0.1:9", "--candidate", "http://127.0.0.1:9",
                 "--model", "m", "--lm-eval-tasks", "hellaswag", "--lm-eval-tokenizer", "/t",
                 "--candidate-kv-dtype", "fp8"], out=io.StringIO())
    assert code == 2
    assert "lm-eval is not installed" in capsys.readouterr().err


def test_kv_quality_without_endpoints_is_a_usage_error(capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    assert main([], out=io.StringIO()) == 2
    assert "--baseline URL and --candidate URL" in capsys.readouterr().err
