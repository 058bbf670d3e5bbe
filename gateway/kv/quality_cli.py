"""``prefixgate kv-quality``: does a quantized KV cache cost too much quality?

    prefixgate kv-quality --baseline URL --candidate URL [--model NAME]
        [--candidate-kv-dtype int8|fp8|...] [--max-drop 0.03] [--limit NAME=DROP ...]
        [--lm-eval-tasks mmlu,hellaswag --lm-eval-tokenizer DIR
         [--lm-eval-include-path DIR] [--lm-eval-limit N] [--lm-eval-python PY]]
        [--json]
    prefixgate kv-quality --emulate fp8|int8|int2 [...]

Two OpenAI-compatible endpoints serving the same model, one with the KV
cache dtype to judge: the built-in probe (``gateway.kv.quality_probe``) always runs,
with one line per passage on stderr (``--quiet``: none), and measures its
own noise floor (the candidate against itself);
lm-eval-harness (``gateway.kv.lmeval``) runs when tasks are named; the rule
(``gateway.kv.gate``) decides. ``--emulate MODE`` starts the transformers KV
emulation (``engine.vllm.kv_emulation``, in the vLLM-on-CPU venv) and judges its
``MODE`` cache against its bf16 one -- for machines where vLLM cannot store
that dtype; every output then says "EMULATION".

The candidate's KV dtype (for the "go back to" advice) is
``--candidate-kv-dtype``, else what the candidate publishes: the
emulation's ``/v1/models`` entry, or vLLM's ``vllm:cache_config_info``
``cache_dtype`` on ``/metrics``. Exit status: 0 pass, 1 fail, 2 error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import httpx

from engine.cli_args import CommandParser
from engine.pool.scrape import parse_vllm_metrics
from engine.spawning import exit_on_signal
from engine.vllm.kv_emulation.process import EmulationSpec, running_emulation
from engine.vllm.local import ReplicaStartError
from gateway.kv import lmeval as kv_lmeval
from gateway.kv.gate import DEFAULT_LIMITS, DEFAULT_MAX_DROP, EXIT_ERROR, GateRule, decide
from gateway.kv.quality_probe import (
    CORPUS_DIR,
    Endpoint,
    PassageScore,
    Progress,
    QualityProbeClient,
    QualityProbeError,
    load_corpus,
    run_quality_probe,
)
from gateway.kv.quality_report import Report, as_dict, render


def _parser() -> argparse.ArgumentParser:
    p = CommandParser(prog="prefixgate kv-quality", description=(
        "Quality gate for a quantized KV cache: baseline vs candidate endpoint."))
    p.add_argument("--baseline", help="base URL of the baseline (e.g. --kv-cache-dtype auto)")
    p.add_argument("--candidate", help="base URL of the candidate (the quantized KV cache)")
    p.add_argument("--model", help="served model name on both (default: each one's first model)")
    p.add_argument("--baseline-model", help="served model name on the baseline (default --model)")
    p.add_argument("--candidate-model",
                   help="served model name on the candidate (default --model)")
    p.add_argument("--api-key", help="bearer token for both endpoints")
    p.add_argument("--candidate-kv-dtype", help="default: what the candidate publishes")
    p.add_argument("--emulate", choices=("fp8", "int8", "int2", "auto"),
                   help="start the transformers KV emulation and judge this mode against bf16")
    p.add_argument("--emulate-model", default="smollm2-135m-instruct",
                   help="model folder of the vLLM-on-CPU setup for --emulate")
    p.add_argument("--max-drop", type=float, default=DEFAULT_MAX_DROP,
                   help="largest relative drop any check may show (default 0.03 = 3%%)")
    p.add_argument("--limit", action="append", default=[], metavar="NAME=DROP",
                   help="a limit for one check or kind (perplexity, greedy_agreement, probe, "
                        "lm-eval, hellaswag:acc_norm, ...); greedy_agreement defaults to 0.10")
    p.add_argument("--continuation-tokens", type=int, default=32,
                   help="greedy tokens generated after each passage (default 32)")
    p.add_argument("--corpus", type=Path, default=CORPUS_DIR,
                   help="folder of <language>.txt passages (default: the shipped corpus)")
    p.add_argument("--passages-per-language", type=int,
                   help="use only the first N passages of each language (default: all)")
    p.add_argument("--lm-eval-tasks", help="comma-separated lm-eval task names")
    p.add_argument("--lm-eval-tokenizer", help="local tokenizer folder for lm-eval")
    p.add_argument("--lm-eval-include-path", help="folder of task YAMLs over local data")
    p.add_argument("--lm-eval-limit", type=int, help="examples per task")
    p.add_argument("--lm-eval-python", help="interpreter that has lm-eval (default: this one)")
    p.add_argument("--lm-eval-output", type=Path, help="where lm-eval writes (default: a temp dir)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quiet", action="store_true",
                   help="no progress lines on stderr (one per passage by default)")
    return p


def progress_printer(out: TextIO) -> Progress:
    """One line per passage on ``out``: the probe takes minutes, and says how far it is."""
    start = time.monotonic()

    def show(done: int, total: int, score: PassageScore) -> None:
        elapsed = time.monotonic() - start
        left = elapsed / done * (total - done)
        print(f"kv-quality: {done}/{total} passages ({score.language}: {score.title}), "
              f"agreement {score.agreement_hits}/{score.agreement_total}, self "
              f"{score.floor_hits}/{score.floor_total}; {elapsed:.0f}s, about {left:.0f}s left",
              file=out, flush=True)

    return show


def _limits(items: Sequence[str]) -> dict[str, float]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--limit {item!r}: expected NAME=DROP")
        out[name.strip()] = float(value)
    return out


def _first_model(http: httpx.Client, url: str) -> dict[str, Any]:
    base = url.rstrip("/").removesuffix("/v1")
    data = http.get(f"{base}/v1/models").json().get("data") or []
    if not data:
        raise QualityProbeError(f"{base}/v1/models lists no model")
    return dict(data[0])


def published_kv_dtype(http: httpx.Client, endpoint: Endpoint) -> str | None:
    """The candidate's own word on its KV dtype: the emulation's model entry, or vLLM's metrics."""
    base = endpoint.url.rstrip("/").removesuffix("/v1")
    with contextlib.suppress(httpx.HTTPError, ValueError):
        for entry in http.get(f"{base}/v1/models").json().get("data") or []:
            if entry.get("id") == endpoint.model and entry.get("kv_cache_dtype"):
                return str(entry["kv_cache_dtype"])
    with contextlib.suppress(httpx.HTTPError):
        answer = http.get(f"{base}/metrics")
        if answer.status_code == 200:
            return parse_vllm_metrics(answer.text).kv_cache_dtype
    return None


@contextlib.contextmanager
def endpoints(args: argparse.Namespace) -> Iterator[tuple[Endpoint, Endpoint]]:
    """The two endpoints: given, or the emulation started for the duration."""
    if args.emulate:
        with running_emulation(EmulationSpec(model=args.emulate_model)) as emu:
            yield (Endpoint(emu.base_url, emu.model("auto")),
                   Endpoint(emu.base_url, emu.model(args.emulate)))
        return
    if not (args.baseline and args.candidate):
        raise ValueError("give --baseline URL and --candidate URL, or --emulate MODE")
    with httpx.Client(timeout=10) as http:
        base_model = args.baseline_model or args.model or _first_model(http, args.baseline)["id"]
        cand_model = args.candidate_model or args.model or _first_model(http, args.candidate)["id"]
    yield (Endpoint(args.baseline, base_model, args.api_key),
           Endpoint(args.candidate, cand_model, args.api_key))


def _lm_eval(args: argparse.Namespace, baseline: Endpoint, candidate: Endpoint
             ) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]] | None:
    if not args.lm_eval_tasks:
        return None
    if not args.lm_eval_tokenizer:
        raise ValueError("--lm-eval-tasks needs --lm-eval-tokenizer (a local tokenizer folder)")
    settings = kv_lmeval.LmEvalSettings(
        tasks=tuple(t.strip() for t in args.lm_eval_tasks.split(",") if t.strip()),
        tokenizer=args.lm_eval_tokenizer, include_path=args.lm_eval_include_path,
        limit=args.lm_eval_limit, python=args.lm_eval_python)
    output = args.lm_eval_output or Path(tempfile.mkdtemp(prefix="prefixgate-lm-eval-"))
    return kv_lmeval.run_both(baseline, candidate, settings, output)


def judge(args: argparse.Namespace) -> Report:
    rule = GateRule(max_drop=args.max_drop, limits={**DEFAULT_LIMITS, **_limits(args.limit)})
    passages = load_corpus(args.corpus, args.passages_per_language)
    with endpoints(args) as (baseline, candidate):
        with httpx.Client(timeout=10) as http:
            kv_dtype = args.candidate_kv_dtype or published_kv_dtype(http, candidate)
        if args.lm_eval_tasks:  # say it is missing before the probe's minutes, not after
            kv_lmeval.find_python(args.lm_eval_python)
        client = QualityProbeClient()
        if not args.quiet:
            print(f"kv-quality: {len(passages)} passages, 4 requests each (baseline, "
                  "candidate, candidate on the baseline's continuation and on its own: the "
                  "noise floor)", file=sys.stderr, flush=True)
        try:
            probe = run_quality_probe(client, baseline, candidate, passages,
                                      args.continuation_tokens,
                                      None if args.quiet else progress_printer(sys.stderr))
        finally:
            client.close()
        lm = _lm_eval(args, baseline, candidate)
    checks = probe.checks()
    lm_eval = None
    if lm is not None:
        checks += kv_lmeval.task_checks(*lm)
        lm_eval = {"baseline": lm[0], "candidate": lm[1]}
    return Report(baseline, candidate, kv_dtype, probe, decide(checks, rule, kv_dtype),
                  args.continuation_tokens, lm_eval)


def main(argv: Sequence[str]) -> int:
    """``prefixgate ...`` hands over the arguments after the subcommand."""
    return run(argv, sys.stdout)


def run(argv: Sequence[str], out: TextIO) -> int:
    """The command, printing to ``out`` (tests hand it a buffer)."""
    args = _parser().parse_args(argv)
    previous = signal.signal(signal.SIGTERM, exit_on_signal)
    try:
        report = judge(args)
    except (ValueError, QualityProbeError, ReplicaStartError, kv_lmeval.LmEvalUnavailable,
            kv_lmeval.LmEvalFailed, httpx.HTTPError) as exc:
        print(f"prefixgate kv-quality: {exc}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(json.dumps(as_dict(report), indent=2, ensure_ascii=False) if args.json
          else render(report), file=out)
    return report.verdict.exit_code
