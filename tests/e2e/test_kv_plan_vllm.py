"""``prefixgate plan`` against what real vLLM-on-CPU reports about its own KV cache.

Three replicas started together (one start each, in parallel), one per
model of ``deploy/vllm-cpu``, at different ``VLLM_CPU_KVCACHE_SPACE`` and
``--num-gpu-blocks-override`` settings. For each, the planner is run as an
operator would (``prefixgate plan MODEL_DIR --cpu-kvcache-space GIB ...
--json``) and its figures are held against vLLM's start-up log ("CPU KV cache
size: N tokens", "Overriding num_gpu_blocks=N ...") and its
``vllm:cache_config_info`` series (``num_gpu_blocks``, ``kv_cache_size_tokens``,
``cache_dtype``): they must agree within 2%.

The SmolLM2 replica (real weights) also answers the quality probe of
``prefixgate kv-quality`` as baseline and candidate at once: that reads
vLLM's real ``prompt_logprobs`` / ``return_token_ids`` answers and its
``cache_dtype``, and a cache judged against itself must pass untouched.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from engine.pool.scrape import parse_vllm_metrics
from engine.vllm.local import LaunchSpec, LocalReplica, VllmCpuSetup, running_replicas
from gateway.kv.plan_cli import run as plan_main
from gateway.kv.quality_cli import run as kv_quality_main

pytestmark = pytest.mark.e2e

TOLERANCE = 0.02


@dataclass(frozen=True)
class Case:
    spec: LaunchSpec

    @property
    def label(self) -> str:
        s = self.spec
        return f"{s.model} space={s.kv_cache_space_gib}GiB override={s.num_gpu_blocks_override}"


CASES = (
    Case(LaunchSpec("qwen2-tiny", max_model_len=2048, kv_cache_space_gib=1, kv_events=False,
                     tool_call_parser=None)),
    Case(LaunchSpec("qwen2-small", max_model_len=4096, kv_cache_space_gib=2,
                     num_gpu_blocks_override=300, kv_events=False, tool_call_parser=None)),
    Case(LaunchSpec("smollm2-135m-instruct", max_model_len=2048, kv_cache_space_gib=1,
                     kv_events=False, tool_call_parser=None)),
)


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[LocalReplica]]:
    missing = VllmCpuSetup.locate().missing_reason()
    if missing:
        pytest.skip(f"REAL-ENGINE TESTS SKIPPED: {missing}")
    specs = [case.spec for case in CASES]
    with running_replicas(specs, log_dir=tmp_path_factory.mktemp("vllm-plan")) as started:
        for replica in started:
            print(f"\nreal vLLM replica {replica.info.replica_id} ({replica.spec.model}) ready "
                  f"in {replica.start_seconds:.1f}s")
        yield started


def planned(spec: LaunchSpec) -> dict:
    argv = [str(VllmCpuSetup.locate().model_path(spec.model)),
            "--cpu-kvcache-space", str(spec.kv_cache_space_gib),
            "--block-size", str(spec.block_size), "--max-model-len", str(spec.max_model_len),
            "--json"]
    if spec.num_gpu_blocks_override is not None:
        argv += ["--num-gpu-blocks-override", str(spec.num_gpu_blocks_override)]
    out = io.StringIO()
    assert plan_main(argv, out=out) == 0
    return json.loads(out.getvalue())


def logged(log_path: Path) -> dict[str, int]:
    text = log_path.read_text(errors="replace")
    found: dict[str, int] = {}
    size = re.search(r"KV cache size: ([\d,]+) tokens", text)
    assert size, "vLLM logged no KV cache size"
    found["kv_cache_size_tokens"] = int(size.group(1).replace(",", ""))
    override = re.search(r"Overriding num_gpu_blocks=(\d+) with num_gpu_blocks_override=(\d+)",
                         text)
    if override:
        found["memory_blocks"] = int(override.group(1))
    return found


def close(planner: float, vllm: float) -> bool:
    return abs(planner - vllm) <= TOLERANCE * vllm


@pytest.mark.parametrize("index", range(len(CASES)), ids=[c.label for c in CASES])
def test_planner_matches_vllms_reported_kv_capacity(replicas: list[LocalReplica],
                                                    index: int) -> None:
    replica = replicas[index]
    spec = replica.spec
    plan = planned(spec)
    metrics_text = httpx.get(f"{replica.info.base_url}/metrics", timeout=10).text
    metrics = parse_vllm_metrics(metrics_text)
    info_line = next(line for line in metrics_text.splitlines()
                     if line.startswith("vllm:cache_config_info{"))
    info = dict(re.findall(r'(\w+)="([^"]*)"', info_line))
    log = logged(replica.info.log_path)
    print(f"\n{CASES[index].label}: planner {plan['num_blocks']} blocks / "
          f"{plan['kv_cache_size_tokens']} tokens (memory {plan['memory_blocks']} blocks); "
          f"vLLM num_gpu_blocks={metrics.num_gpu_blocks}, log {log}")

    assert metrics.kv_cache_dtype == "auto"
    assert metrics.num_gpu_blocks is not None
    assert close(plan["num_blocks"], metrics.num_gpu_blocks)
    assert close(plan["kv_cache_size_tokens"], log["kv_cache_size_tokens"])
    assert close(plan["kv_cache_size_tokens"], int(info["kv_cache_size_tokens"]))
    assert close(plan["kv_memory_bytes_per_gpu"], int(info["kv_cache_memory_bytes"]))
    if spec.num_gpu_blocks_override is not None:
        # What the KV space alone would have given, before the override replaced it.
        assert close(plan["memory_blocks"], log["memory_blocks"])
        assert metrics.num_gpu_blocks == spec.num_gpu_blocks_override


def test_the_quality_probe_reads_real_vllm(replicas: list[LocalReplica]) -> None:
    smollm2 = next(r for r in replicas if r.spec.model == "smollm2-135m-instruct")
    out = io.StringIO()
    code = kv_quality_main(["--baseline", smollm2.info.base_url, "--candidate",
                            smollm2.info.base_url, "--passages-per-language", "1",
                            "--continuation-tokens", "8", "--json"], out=out)
    report = json.loads(out.getvalue())
    assert code == 0, report["advice"]
    assert not report["emulation"] and report["candidate"]["kv_cache_dtype"] == "auto"
    assert report["probe"]["perplexity_ratio"] == pytest.approx(1.0, abs=1e-3)
    assert report["probe"]["greedy_agreement"] >= 0.95
    assert report["candidate"]["fingerprint"].startswith("vllm-")
