"""Real sockets: the gateway process in front of simulated vLLM replica processes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from engine.tokenizer import bundled_qwen_tokenizer_dir
from tests.support.gateway import GatewayProcess
from tests.support.sim import SimProcess

MODEL = "sim-model"


def sim_args(seed: int, *extra: str) -> list[str]:
    tokenizer = bundled_qwen_tokenizer_dir()
    assert tokenizer
    return ["--served-model-name", MODEL, "--tokenizer", tokenizer, "--time-scale", "50",
            "--seed", str(seed), "--output-len-min", "4", "--output-len-max", "24", *extra]


def gateway_settings(sims: list[SimProcess], policy: str = "least_load", **extra: object) -> dict:
    return {
        "policy": policy,
        "health_interval": 0.2,
        "replicas": [{"id": f"s{i}", "url": sim.base_url, "model": MODEL}
                     for i, sim in enumerate(sims)],
        "models": [{"name": MODEL, "tokenizer": bundled_qwen_tokenizer_dir()}],
        **extra,
    }


@pytest.fixture(scope="module")
def two_sims() -> Iterator[list[SimProcess]]:
    sims = [SimProcess(sim_args(i)) for i in range(2)]
    try:
        for sim in sims:
            sim.start()
        yield sims
    finally:
        for sim in sims:
            sim.close()


@pytest.fixture(scope="module")
def gateway(two_sims: list[SimProcess]) -> Iterator[GatewayProcess]:
    gw = GatewayProcess(gateway_settings(two_sims, max_body_bytes=200_000))
    try:
        yield gw.start()
    finally:
        gw.stop()
