"""Replicas dying and coming back: rotation, readiness, failover, broken streams."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import httpx
import openai
import pytest

from tests.support.gateway import GatewayProcess
from tests.support.sim import SimProcess
from tests.support.waiting import wait_until

from .conftest import MODEL, gateway_settings, sim_args

CHAT: list[Any] = [{"role": "user", "content": "hello there"}]


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
    wait_until(lambda: not replica_healthy(gw, "s0"), 15, "s0 out of rotation")

    sims[1].stop()
    wait_until(lambda: httpx.get(gw.url + "/ready").status_code == 503, 15,
               "the gateway not ready without replicas")
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2)
    assert info.value.status_code == 503
    assert info.value.response.headers["retry-after"]

    sims[0].start()
    wait_until(lambda: httpx.get(gw.url + "/ready").status_code == 200, 15,
               "the gateway ready again with s0 back")
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
        victim.kill()  # mid-stream: 400 tokens at the replica's real-time pace take seconds
        with pytest.raises(openai.APIError):
            for _ in chunks:
                pass
    # nothing leaked, and the survivor serves the next requests
    for _ in range(3):
        reply = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2)
        assert reply.choices[0].message.content is not None
    metrics = httpx.get(gw.url + "/metrics").text
    assert f'prefixgate_stream_errors_total{{replica="s{sims.index(victim)}"}} 1.0' in metrics
    def nothing_open(replica: str) -> bool:
        gauge = f'prefixgate_replica_inflight_requests{{replica="{replica}"}} 0.0'
        return gauge in httpx.get(gw.url + "/metrics").text

    for replica in ("s0", "s1"):
        wait_until(partial(nothing_open, replica), 15, f"no request left open on {replica}")
