"""``prefixgate kv-quality`` end to end.

* Against the transformers KV emulation (``engine.vllm.kv_emulation``, run in the
  vLLM-on-CPU venv with the real SmolLM2-135M-Instruct): a deliberately broken
  2-bit KV cache fails the gate and is sent back to INT8; an FP8 E4M3 cache
  passes. Every output says "EMULATION". One emulation server (about 5 s to
  start) serves the baseline and both candidates.
* Against real vLLM with ``--kv-cache-dtype fp8`` beside ``auto`` (two
  SmolLM2 replicas): only where vLLM on CPU can store FP8 KV (x86 with
  AVX-512 or AMX); elsewhere the test says so and skips. There the planner's
  FP8 block count is held against vLLM's too.

A short probe (one passage per language, 16-token continuations) keeps this
to about a minute on 2 cores.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from engine.pool.scrape import parse_vllm_metrics
from engine.vllm.kv_emulation.process import EmulationServer, EmulationSpec, running_emulation
from engine.vllm.local import LaunchSpec, VllmCpuSetup, running_replicas
from gateway.kv.plan_cli import run as plan_main
from gateway.kv.quality_cli import run as main

pytestmark = pytest.mark.e2e

SHORT = ["--passages-per-language", "1", "--continuation-tokens", "16", "--json"]
FP8_REFUSED = "FP8 KV cache on CPU requires x86 with AVX-512 or AMX"


def setup_or_skip() -> VllmCpuSetup:
    setup = VllmCpuSetup.locate()
    missing = setup.missing_reason()
    if missing:
        pytest.skip(f"REAL-ENGINE TESTS SKIPPED: {missing}")
    return setup


@pytest.fixture(scope="module")
def emulation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulationServer]:
    setup = setup_or_skip()
    with running_emulation(EmulationSpec(), setup=setup,
                           log_dir=tmp_path_factory.mktemp("kv-emulation")) as server:
        yield server


def gate(baseline: str, candidate: str, base_model: str, cand_model: str,
         *extra: str) -> tuple[int, dict]:
    out = io.StringIO()
    code = main(["--baseline", baseline, "--candidate", candidate, "--baseline-model", base_model,
                 "--candidate-model", cand_model, *SHORT, *extra], out=out)
    return code, json.loads(out.getvalue())


def test_a_broken_2bit_kv_cache_fails_and_is_sent_back_to_int8(emulation: EmulationServer
                                                                ) -> None:
    code, report = gate(emulation.base_url, emulation.base_url, emulation.model("auto"),
                        emulation.model("int2"), "--continuation-tokens", "8")
    assert code == 1 and not report["passed"]
    assert report["emulation"] and "EMULATION" in report["label"]
    assert report["candidate"]["kv_cache_dtype"] == "int2"
    assert report["next_safer_kv_dtype"] == "int8"
    assert report["probe"]["perplexity_ratio"] > 2
    assert "--kv-cache-dtype int8" in report["advice"]


def test_an_fp8_kv_cache_passes(emulation: EmulationServer) -> None:
    code, report = gate(emulation.base_url, emulation.base_url, emulation.model("auto"),
                        emulation.model("fp8"))
    print(f"\nemulated FP8: perplexity ratio {report['probe']['perplexity_ratio']:.4f}, "
          f"greedy agreement {report['probe']['greedy_agreement']:.1%}")
    assert code == 0 and report["passed"], report["advice"]
    assert report["emulation"] and report["candidate"]["kv_cache_dtype"] == "fp8"
    assert report["probe"]["perplexity_ratio"] < 1.03
    assert set(report["probe"]["by_language"]) >= {"en", "zh"}


def test_an_endpoint_against_itself_passes_at_its_noise_floor_and_shows_progress(
        emulation: EmulationServer, capsys: pytest.CaptureFixture[str]) -> None:
    code, report = gate(emulation.base_url, emulation.base_url, emulation.model("auto"),
                        emulation.model("auto"))
    assert code == 0 and report["passed"], report["advice"]
    floor = report["probe"]["noise_floor"]
    assert 0 < floor["greedy_agreement"] <= 1
    for check in report["checks"]:
        assert check["drop_beyond_noise"] == pytest.approx(
            check["relative_drop"] - check["noise_floor"])
        assert abs(check["drop_beyond_noise"]) < 0.01, check  # itself: nothing beyond noise
    progress = capsys.readouterr().err.splitlines()
    passages = len(report["probe"]["passages"])
    assert [line.split()[1] for line in progress if "/" in line.split()[1]] == [
        f"{i}/{passages}" for i in range(1, passages + 1)]


def test_the_text_report_is_labelled_emulation(emulation: EmulationServer,
                                               tmp_path: Path) -> None:
    (tmp_path / "en.txt").write_text("# One passage\nThe ferry leaves the island at dawn and "
                                     "returns with the mail, the bread and the newspapers.\n")
    out = io.StringIO()
    main(["--baseline", emulation.base_url, "--candidate", emulation.base_url,
          "--baseline-model", emulation.model("auto"), "--candidate-model",
          emulation.model("int8"), "--continuation-tokens", "4", "--corpus", str(tmp_path)],
         out=out)
    text = out.getvalue()
    assert text.startswith("prefixgate kv-quality -- EMULATION")
    assert text.rstrip().endswith("not vLLM's)")


def cpu_stores_fp8_kv() -> bool:
    """vLLM's own condition (``_get_attn_isa``): x86 with AVX-512 or AMX."""
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    return "avx512f" in flags or "amx_tile" in flags


def test_real_vllm_fp8_kv_against_auto(tmp_path: Path) -> None:
    setup_or_skip()
    if not cpu_stores_fp8_kv():
        pytest.skip(f"vLLM on CPU refuses an FP8 KV cache on this machine ({FP8_REFUSED}; "
                    "no avx512f or amx_tile in /proc/cpuinfo): the gate is tested against the "
                    "KV emulation above instead")
    base = LaunchSpec("smollm2-135m-instruct", served_model_name="smollm2", max_model_len=2048,
                       kv_events=False, tool_call_parser=None)
    fp8 = LaunchSpec("smollm2-135m-instruct", served_model_name="smollm2", max_model_len=2048,
                      kv_events=False, tool_call_parser=None,
                      extra_args=("--kv-cache-dtype", "fp8"))
    with running_replicas([base, fp8], log_dir=tmp_path) as (auto_replica, fp8_replica):
        code, report = gate(auto_replica.info.base_url, fp8_replica.info.base_url, "smollm2",
                            "smollm2")
        blocks = parse_vllm_metrics(httpx.get(f"{fp8_replica.info.base_url}/metrics").text
                                    ).num_gpu_blocks
    # The planner's FP8 figure is vLLM's too: half the bytes per token, twice the blocks.
    planned = io.StringIO()
    plan_main([str(setup_or_skip().model_path("smollm2-135m-instruct")), "--kv-cache-dtype", "fp8",
               "--cpu-kvcache-space", "1", "--block-size", "32", "--max-model-len", "2048",
               "--json"], out=planned)
    assert json.loads(planned.getvalue())["num_blocks"] == blocks
    print(f"\nreal vLLM FP8 KV: perplexity ratio {report['probe']['perplexity_ratio']:.4f}, "
          f"greedy agreement {report['probe']['greedy_agreement']:.1%}: {report['advice']}")
    assert code in (0, 1)
    assert not report["emulation"] and report["label"] == "real endpoints"
    assert report["candidate"]["kv_cache_dtype"] == "fp8"  # from vllm:cache_config_info
    assert report["probe"]["perplexity_ratio"] < 1.5


def test_the_emulation_answers_lm_evals_loglikelihood_request(emulation: EmulationServer) -> None:
    # lm-eval's local-completions payload for loglikelihood (tokenized requests).
    body = {"model": emulation.model("fp8"), "prompt": [[504, 2365, 6354], [504, 905]],
            "temperature": 0, "max_tokens": 1, "logprobs": 1, "seed": 1234, "echo": True}
    answer = httpx.post(f"{emulation.base_url}/v1/completions", json=body, timeout=60).json()
    choices = sorted(answer["choices"], key=lambda c: c["index"])
    assert [len(c["logprobs"]["token_logprobs"]) for c in choices] == [3 + 1, 2 + 1]
    first = choices[0]["logprobs"]
    assert first["token_logprobs"][0] is None and first["top_logprobs"][0] is None
    assert all(lp <= 0 for lp in first["token_logprobs"][1:])
    assert all(len(top) >= 1 for top in first["top_logprobs"][1:])
    assert answer["kv_emulation"]["kv_cache_dtype"] == "fp8"
