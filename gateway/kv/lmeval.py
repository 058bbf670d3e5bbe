"""lm-evaluation-harness (the ``lm-eval`` package) against the baseline and the candidate.

Optional: prefixgate does not depend on ``lm-eval``. It is run as a
subprocess (``python -m lm_eval``) of an interpreter that has it -- this one,
or ``--lm-eval-python``; when none has it, :class:`LmEvalUnavailable` says
so and how to install it. Each endpoint is evaluated with lm-eval's
``local-completions`` model (``/v1/completions`` with ``echo`` and
``logprobs``, which vLLM and the KV emulation both serve), the prompts
tokenized by ``tokenizer`` (a local Hugging Face folder), one request at a
time, offline (``HF_DATASETS_OFFLINE`` / ``HF_HUB_OFFLINE``): the tasks must
come from local data -- ``include_path`` holds task YAMLs whose
``dataset_path`` / ``data_files`` point at local files, or the datasets'
cache already has them.

From lm-eval's ``results_*.json`` each task's figures (``acc,none`` ->
``acc``; ``_stderr`` figures and non-metrics such as ``sample_len`` dropped) are compared per task on the first of
``acc_norm``, ``acc``, ``exact_match``, ``f1`` that both runs have, as
``lm-eval`` checks for ``gateway.kv.gate`` (higher is better, so the drop is
``(baseline − candidate) / baseline``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.kv.gate import Check
from gateway.kv.quality_probe import Endpoint

PREFERRED_METRICS = ("acc_norm", "acc", "exact_match", "f1")
INSTALL_HINT = ("pip install 'lm-eval==0.4.13' (into this venv, or any venv passed as "
                "--lm-eval-python)")


class LmEvalUnavailable(RuntimeError):
    """lm-eval is not installed where we looked."""


class LmEvalFailed(RuntimeError):
    """lm-eval ran but produced no results (the message has its output's tail)."""


@dataclass(frozen=True, slots=True)
class LmEvalSettings:
    tasks: tuple[str, ...]
    tokenizer: str
    include_path: str | None = None
    limit: int | None = None
    python: str | None = None
    """An interpreter with lm-eval; default: this one."""


def find_python(python: str | None) -> str:
    """The interpreter to run lm-eval with; :class:`LmEvalUnavailable` when it lacks lm-eval."""
    if python is None:
        if importlib.util.find_spec("lm_eval") is None:
            raise LmEvalUnavailable(f"lm-eval is not installed in {sys.prefix}: {INSTALL_HINT}")
        return sys.executable
    probe = subprocess.run([python, "-c", "import lm_eval"], capture_output=True, text=True,
                           check=False)
    if probe.returncode != 0:
        raise LmEvalUnavailable(f"lm-eval is not importable by {python}: {INSTALL_HINT}")
    return python


def command(python: str, endpoint: Endpoint, settings: LmEvalSettings, output: Path) -> list[str]:
    model_args = ",".join([
        f"model={endpoint.model}", f"base_url={endpoint.completions_url}",
        f"tokenizer={settings.tokenizer}", "tokenizer_backend=huggingface",
        "tokenized_requests=True", "num_concurrent=1", "max_retries=3"])
    argv = [python, "-m", "lm_eval", "--model", "local-completions", "--model_args", model_args,
            "--tasks", ",".join(settings.tasks), "--batch_size", "1", "--output_path", str(output)]
    if settings.include_path:
        argv += ["--include_path", settings.include_path]
    if settings.limit:
        argv += ["--limit", str(settings.limit)]
    return argv


def parse_results(document: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """``{"results": {task: {"acc,none": 0.5, "acc_stderr,none": ...}}}`` -> ``{task: {"acc": 0.5}}``.
    """
    out: dict[str, dict[str, float]] = {}
    for task, figures in (document.get("results") or {}).items():
        kept: dict[str, float] = {}
        for key, value in figures.items():
            metric, comma, _ = key.partition(",")  # metrics are "name,filter"; alias, sample_len
            if not comma or metric.endswith("_stderr") or not isinstance(value, int | float) \
                    or isinstance(value, bool):
                continue
            kept.setdefault(metric, float(value))
        out[task] = kept
    return out


def task_checks(baseline: Mapping[str, Mapping[str, float]],
                candidate: Mapping[str, Mapping[str, float]]) -> list[Check]:
    checks = []
    for task in sorted(set(baseline) & set(candidate)):
        metric = next((m for m in PREFERRED_METRICS
                       if m in baseline[task] and m in candidate[task]), None)
        if metric is not None:
            checks.append(Check(f"{task}:{metric}", "lm-eval", baseline[task][metric],
                                candidate[task][metric], higher_is_better=True))
    return checks


def run(endpoint: Endpoint, settings: LmEvalSettings, output: Path) -> dict[str, dict[str, float]]:
    """One lm-eval run against ``endpoint``; its log is ``output/lm-eval.log``."""
    python = find_python(settings.python)
    output.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "OPENAI_API_KEY": endpoint.api_key or "unused"}
    log = output / "lm-eval.log"
    with open(log, "w", encoding="utf-8") as sink:
        done = subprocess.run(command(python, endpoint, settings, output), stdout=sink,
                              stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL,
                              check=False)
    found = sorted(output.rglob("results_*.json"), key=lambda p: p.stat().st_mtime)
    if done.returncode != 0 or not found:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise LmEvalFailed(f"lm-eval exited with {done.returncode} for {endpoint.model}; "
                           f"log {log}:\n{tail}")
    return parse_results(json.loads(found[-1].read_text(encoding="utf-8")))


def run_both(baseline: Endpoint, candidate: Endpoint, settings: LmEvalSettings,
             output: Path) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    return run(baseline, settings, output / "baseline"), run(candidate, settings,
                                                             output / "candidate")


def describe(results: Mapping[str, Mapping[str, float]]) -> Sequence[str]:
    return [f"{task}: " + ", ".join(f"{k} {v:.4f}" for k, v in sorted(figures.items()))
            for task, figures in sorted(results.items())]
