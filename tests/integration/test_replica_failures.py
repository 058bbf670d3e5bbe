"""Replicas dying and coming back: rotation, readiness, failover, broken streams."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.support.gateway import GatewayProcess
from tests.support.sim import SimProcess

from .conftest import MODEL, gateway_settings, sim_args

CHAT = [{"role": "user", "content": "hello there"}]


def wait_for(predicate, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


@pytest.fixture()
def cluster() -> Iterator[tuple[list[SimProcess], GatewayProcess]]:
    # slow replicas (real-time pace) so a stream is still running when one is killed
    sims = [SimProcess(sim_args(i, "--time-scale", "1", "--decode-per-seq", "0.02"))
            for i in range(2)]
    gw = GatewayProcess(gateway_settings(sims, policy="round_robin"))
    try:
        for sim in sims:
            sim.start()
        gw.start()
        yield sims, gw
    finally:
        gw.stop()
        for sim in sims:
            sim.close()


def replica_healthy(gw: GatewayProcess, replica: str) -> bool:
    text = httpx.get(gw.url + "/metrics").text
    return f'prefixgate_replica_healthy{{replica="{replica}"}} 1.0' in text


def test_dead_replica_leaves_rotation_and_returns(cluster) -> None:
    sims, gw = cluster
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
    sims[0].stop()
    served = set()
    for _ in range(6):
        raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=CHAT,
                                                                max_tokens=2)
        served.add(raw.headers["x-prefixgate-replica"])
    assert served == {"s1"}
    assert httpx.get(gw.url + "/ready").status_code == 200
    wait_for(lambda: not replica_healthy(gw, "s0"))

    sims[1].stop()
    wait_for(lambda: httpx.get(gw.url + "/ready").status_code == 503)
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2)
    assert info.value.status_code == 503
    assert info.value.response.headers["retry-after"]

    sims[0].start()
    wait_for(lambda: httpx.get(gw.url + "/ready").status_code == 200)
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=CHAT,
                                                            max_tokens=2)
    assert raw.headers["x-prefixgate-replica"] == "s0"


def test_stream_cut_by_dying_replica_raises_and_others_keep_serving(cluster) -> None:
    sims, gw = cluster
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
    stream = client.chat.completions.with_streaming_response.create(
        model=MODEL, messages=CHAT, stream=True, max_tokens=400,
        extra_body={"ignore_eos": True})
    with stream as response:
        victim = sims[int(response.headers["x-prefixgate-replica"][1:])]
        chunks = iter(response.parse())
        assert next(chunks).choices[0].delta.role == "assistant"
        threading.Timer(0.3, victim.kill).start()
        with pytest.raises(openai.APIError):
            for _ in chunks:
                pass
    # nothing leaked, and the survivor serves the next requests
    for _ in range(3):
        reply = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2)
        assert reply.choices[0].message.content is not None
    metrics = httpx.get(gw.url + "/metrics").text
    assert f'prefixgate_stream_errors_total{{replica="s{sims.index(victim)}"}} 1.0' in metrics
    for replica in ("s0", "s1"):
        wait_for(lambda r=replica: f'prefixgate_replica_inflight_requests{{replica="{r}"}} 0.0'
                 in httpx.get(gw.url + "/metrics").text)
