"""Real vLLM-on-CPU replicas (``deploy/vllm-cpu/setup.sh``) behind the real gateway.

Every test here is skipped, loudly, when the real-engine setup is absent;
``scripts/test.sh`` runs the setup first so CI always has it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.vllm.local import LaunchSpec, LocalReplica, VllmCpuSetup, running_replicas
from tests.support.gateway import GatewayProcess

MODEL = "qwen2-tiny"
BLOCKS = 96
"""A small KV cache (96 blocks of 32 tokens) so that eviction happens in a test."""
SPEC = LaunchSpec(model=MODEL, max_model_len=2048, num_gpu_blocks_override=BLOCKS,
                  extra_env=(("VLLM_ENABLE_RESPONSES_API_STORE", "1"),),
                  extra_args=("--enable-scale-out", "--trust-request-chat-template"))
"""The store keeps /v1/responses answers in the replica, so previous_response_id works;
scale-out serves the render routes, whose token ids the gateway's rendering is checked
against (Responses and Messages API requests with tools and tool calls); a request's own
chat template is taken, so the rendering is checked with other templates too."""


def setup_or_skip() -> VllmCpuSetup:
    setup = VllmCpuSetup.locate()
    missing = setup.missing_reason()
    if missing:
        pytest.skip(f"REAL-ENGINE TESTS SKIPPED: {missing}")
    return setup


def gateway_settings(replicas: list[LocalReplica], setup: VllmCpuSetup,
                     policy: str = "precise", **extra: object) -> dict:
    return {
        "policy": policy,
        "health_interval": 0.5,
        "default_block_size": 32,
        "models": [{"name": MODEL, "tokenizer": str(setup.model_path(MODEL))}],
        "replicas": [
            {"id": r.info.replica_id, "url": r.info.base_url, "model": MODEL,
             "kv_events": {"endpoint": r.info.kv_events_endpoint,
                           "replay_endpoint": r.info.kv_replay_endpoint,
                           "topic": r.info.kv_topic}}
            for r in replicas],
        **extra,
    }


@pytest.fixture(scope="module")
def vllm_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[LocalReplica]]:
    setup_or_skip()
    started = time.monotonic()
    with running_replicas([SPEC, SPEC], log_dir=tmp_path_factory.mktemp("vllm")) as replicas:
        for replica in replicas:
            print(f"\nreal vLLM replica {replica.info.replica_id} ready in "
                  f"{replica.start_seconds:.1f}s (pair up in {time.monotonic() - started:.1f}s)")
        yield replicas


@pytest.fixture(scope="module")
def real_gateway(vllm_pair: list[LocalReplica]) -> Iterator[GatewayProcess]:
    gw = GatewayProcess(gateway_settings(vllm_pair, VllmCpuSetup.locate()))
    try:
        yield gw.start(timeout=120)
    finally:
        gw.stop()


def model_dir() -> Path:
    return VllmCpuSetup.locate().model_path(MODEL)
