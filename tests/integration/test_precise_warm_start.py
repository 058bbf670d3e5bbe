"""precise starts warm, and knows cache salts, behind the real gateway process.

Two sim replicas publish KV events. One of them caches a system prompt, and
a salted prompt, *before* the gateway starts. The gateway's subscriber must
learn both from the replicas' replay buffers alone (nothing is published
after it starts), so the very first request sharing that system prompt is
routed to the warm replica as a hit, a request with the same salt finds the
salted blocks, and one with another salt (or none) does not.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import msgpack
import openai
import pytest
import zmq

from tests.support.gateway import GatewayProcess
from tests.support.ports import free_port
from tests.support.sim import SimProcess
from tests.support.waiting import wait_until

from .conftest import MODEL, gateway_settings, sim_args

SYSTEM = "You are the warm-start assistant. " + "Answer from the cached handbook. " * 80
TENANT = "Tenant handbook, private to one customer. " * 80


@pytest.fixture(scope="module")
def sims() -> Iterator[list[SimProcess]]:
    started = []
    try:
        for i in range(2):
            pub, replay = free_port(), free_port()
            args = sim_args(i, "--block-size", "16", "--kv-events-port", str(pub),
                            "--kv-events-replay-port", str(replay))  # fmt: skip
            sim = SimProcess(args)
            sim.kv_ports = (pub, replay)  # type: ignore[attr-defined]
            started.append(sim.start())
        yield started
    finally:
        for sim in started:
            sim.close()


def replay_buffer(sim: SimProcess) -> tuple[int, int]:
    """(batches, stored blocks) in the sim's replay buffer, asked over its replay socket."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    try:
        dealer.connect(f"tcp://127.0.0.1:{sim.kv_ports[1]}")  # type: ignore[attr-defined]
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        batches = blocks = 0
        while dealer.poll(5000):
            _, _, seq, payload = dealer.recv_multipart()
            if int.from_bytes(seq, "big", signed=True) < 0:
                return batches, blocks
            batches += 1
            events = msgpack.unpackb(payload)[1]
            blocks += sum(len(e["block_hashes"]) for e in events if e["type"] == "BlockStored")
        raise AssertionError("no end marker from the replay socket")
    finally:
        dealer.close(linger=0)
        context.term()


def test_the_first_request_after_start_up_hits_what_a_replica_already_caches(
    sims: list[SimProcess],
) -> None:
    warm = sims[1]
    direct = openai.OpenAI(base_url=warm.v1_url, api_key="x", max_retries=0)
    direct.chat.completions.create(
        model=MODEL, max_tokens=2,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hello"}],
    )  # fmt: skip
    direct.chat.completions.create(
        model=MODEL, max_tokens=2, extra_body={"cache_salt": "tenant-a"},
        messages=[{"role": "system", "content": TENANT}, {"role": "user", "content": "hello"}],
    )  # fmt: skip
    wait_until(lambda: replay_buffer(warm)[0] >= 2, what="both prompts in the replay buffer")
    published, stored = replay_buffer(warm)

    settings = gateway_settings(sims, policy="precise")
    for replica, sim in zip(settings["replicas"], sims):
        pub, replay = sim.kv_ports  # type: ignore[attr-defined]
        replica["kv_events"] = {"endpoint": f"tcp://127.0.0.1:{pub}",
                                "replay_endpoint": f"tcp://127.0.0.1:{replay}"}  # fmt: skip
    gw = GatewayProcess(settings)
    try:
        gw.start()

        def indexed() -> dict[str, int]:
            replicas = httpx.get(gw.url + "/admin/replicas").json()["replicas"]
            return {r["id"]: r["indexed_blocks"] for r in replicas}

        wait_until(lambda: indexed()["s1"] == stored, what="the warm replica's blocks indexed")
        assert indexed()["s0"] == 0
        assert replay_buffer(warm)[0] == published  # learnt from the replay, not from news

        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, max_tokens=2,
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}],
        )  # fmt: skip
        assert raw.headers["x-prefixgate-replica"] == "s1"
        assert int(raw.headers["x-prefixgate-matched-tokens"]) > 300
        usage = raw.parse().usage
        assert usage is not None and usage.prompt_tokens_details is not None
        assert (usage.prompt_tokens_details.cached_tokens or 0) > 300

        def tenant_request(salt: str | None) -> tuple[str, int]:
            extra = {"cache_salt": salt} if salt is not None else {}
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL, max_tokens=2, extra_body=extra,
                messages=[{"role": "system", "content": TENANT},
                          {"role": "user", "content": "hi"}],
            )  # fmt: skip
            return raw.headers["x-prefixgate-replica"], int(
                raw.headers["x-prefixgate-matched-tokens"]
            )

        replica, matched = tenant_request("tenant-a")
        assert replica == "s1" and matched > 300  # the salted blocks, under the salted seed
        assert tenant_request("tenant-b")[1] == 0
        assert tenant_request(None)[1] == 0
    finally:
        gw.stop()
