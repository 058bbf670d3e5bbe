"""Real sockets: the gateway process in front of simulated vLLM replica processes,
and the gateway's production HTTP backend against scripted servers."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import redis

from engine.backends.base import Timeouts
from engine.backends.remote import RemoteBackend
from engine.tokenizer import bundled_qwen_tokenizer_dir
from tests.support.gateway import GatewayProcess
from tests.support.sim import SimProcess

MODEL = "sim-model"
SYSTEM_REDIS = "redis://127.0.0.1:6379/0"
"""The machine's Redis (development and CI): each test works under a key prefix of its own."""


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


MakeBackend = Callable[..., RemoteBackend]


@pytest.fixture
async def remote_backend() -> AsyncIterator[MakeBackend]:
    """``remote_backend(url, api_key=None, **timeouts)``: a ``RemoteBackend`` for replica
    ``r1``, closed after the test."""
    made: list[RemoteBackend] = []

    def make(url: str, api_key: str | None = None, **timeouts: float) -> RemoteBackend:
        made.append(RemoteBackend("r1", url, Timeouts(**timeouts), api_key=api_key))
        return made[-1]

    yield make
    for backend in made:
        await backend.aclose()


@contextlib.contextmanager
def started(sims: list[SimProcess]) -> Iterator[list[SimProcess]]:
    """The sim processes started, all stopped on the way out."""
    try:
        for sim in sims:
            sim.start()
        yield sims
    finally:
        for sim in sims:
            sim.close()


def running_sims(args: list[list[str]]) -> contextlib.AbstractContextManager[list[SimProcess]]:
    """One sim replica process per argument list, all stopped on the way out."""
    return started([SimProcess(a) for a in args])


@pytest.fixture
def key_prefix() -> Iterator[str]:
    """A Redis key prefix of this test's own, its keys deleted afterwards."""
    prefix = f"prefixgate-test-{secrets.token_hex(6)}:"
    yield prefix
    client = redis.Redis.from_url(SYSTEM_REDIS)
    keys = list(client.scan_iter(match=prefix + "*"))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture(scope="module")
def two_sims() -> Iterator[list[SimProcess]]:
    with running_sims([sim_args(i) for i in range(2)]) as sims:
        yield sims


@pytest.fixture(scope="module")
def gateway(two_sims: list[SimProcess]) -> Iterator[GatewayProcess]:
    gw = GatewayProcess(gateway_settings(two_sims, max_body_bytes=200_000))
    try:
        yield gw.start()
    finally:
        gw.stop()
