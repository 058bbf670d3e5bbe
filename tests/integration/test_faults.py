"""Faults end cleanly: replicas killed or hung under load, clients that leave or
crawl, and the gateway's own SIGTERM — real sockets, sim replica processes, the
gateway as a subprocess, the official openai client as the caller.

Every stream is classified the way a user would see it: ``complete`` (its last
chunk has a finish reason), ``error_event`` (it started and ended with the
gateway's SSE error event, which the client raises as ``openai.APIError``),
``cut`` (it started and then the body just broke off: what must never
happen) or ``failed`` (nothing came at all). The deadlines are set small here
and serve as bounds on what the test observes, with a generous margin.
"""

from __future__ import annotations

import asyncio
import os
import re
import select
import signal
import socket
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import openai
import orjson
import pytest

from tests.support.gateway import GatewayProcess, running_gateway
from tests.support.sim import SimProcess
from tests.support.waiting import eventually, wait_until

from .conftest import MODEL, gateway_settings, running_sims, sim_args

FIRST_BYTE = 10.0
IDLE = 5.0
MARGIN = 20.0
"""Seconds on top of a deadline that the slowest observed request may take (a loaded
machine), still far below what an unbounded wait (the old 600 s) would show."""

STREAMS = 50

FAULT_TIMEOUTS = {"first_byte": FIRST_BYTE, "idle": IDLE, "probe": 1.0, "response": 60.0}


def paced(seed: int) -> list[str]:
    """A sim at real-time pace, so streams are still running when the fault comes."""
    return sim_args(seed, "--time-scale", "1", "--decode-per-seq", "0.002",
                    "--step-overhead", "0.01")


@dataclass
class Result:
    kind: str
    first_chunk_after: float | None = None


async def one_stream(client: openai.AsyncOpenAI, index: int, max_tokens: int,
                     started: list[int]) -> Result:
    loop = asyncio.get_running_loop()
    sent = loop.time()
    first: float | None = None
    finish = None
    try:
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"tell story number {index}"}],
            stream=True, max_tokens=max_tokens, extra_body={"ignore_eos": True})
        async for chunk in stream:
            if first is None:
                first = loop.time() - sent
                started.append(index)
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
    except openai.APIConnectionError:
        return Result("cut" if first is not None else "failed", first)
    except openai.APIError:
        return Result("error_event" if first is not None else "failed", first)
    return Result("complete" if finish else "cut", first)


def client_of(gw: GatewayProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0,
                              timeout=FIRST_BYTE + MARGIN + 60)


def replica_healthy(gw: GatewayProcess, replica: str) -> bool:
    text = httpx.get(gw.url + "/metrics").text
    return f'prefixgate_replica_healthy{{replica="{replica}"}} 1.0' in text


@pytest.fixture()
def three_paced_sims() -> Iterator[list[SimProcess]]:
    with running_sims([paced(i) for i in range(3)]) as sims:
        yield sims


@pytest.fixture()
def fault_gateway(three_paced_sims: list[SimProcess]) -> Iterator[GatewayProcess]:
    gw = GatewayProcess(gateway_settings(three_paced_sims, policy="round_robin",
                                         timeouts=FAULT_TIMEOUTS, breaker={"cooldown": 2.0}))
    try:
        yield gw.start()
    finally:
        gw.stop()


async def streams_through_a_fault(gw: GatewayProcess, fault: Callable[[], None],
                                  victim: SimProcess) -> Counter[str]:
    client = client_of(gw)
    started: list[int] = []
    tasks = [asyncio.ensure_future(one_stream(client, i, 120, started)) for i in range(STREAMS)]
    await eventually(lambda: len(started) >= 10, 60, "ten streams started")
    # The replica worked after the requests waiting on it arrived (it started some of
    # them), so they did not stop it: they go on to the others. (One that stops a replica
    # with no sign of life after it arrived is answered instead: test_query_of_death.)
    await eventually(lambda: sim_metric(victim, "vllm:generation_tokens_total") > 0, 30,
                     "the victim started a stream")
    await asyncio.sleep(0.2)
    fault()
    results = await asyncio.gather(*tasks)
    kinds = Counter(r.kind for r in results)
    slowest = max(r.first_chunk_after or 0.0 for r in results)
    assert kinds["failed"] == 0, kinds
    assert kinds["cut"] == 0, kinds
    assert kinds["complete"] + kinds["error_event"] == STREAMS
    assert slowest <= FIRST_BYTE + MARGIN, f"a request waited {slowest:.1f}s for its first chunk"
    # the survivors serve what comes next
    for i in range(5):
        assert (await one_stream(client, 1000 + i, 4, [])).kind == "complete"
    await client.close()
    return kinds


async def test_a_replica_killed_under_50_streams_loses_no_request_that_had_not_started(
        three_paced_sims: list[SimProcess], fault_gateway: GatewayProcess) -> None:
    await streams_through_a_fault(fault_gateway, three_paced_sims[0].kill, three_paced_sims[0])
    assert not replica_healthy(fault_gateway, "s0")


async def test_a_hung_replica_under_50_streams_is_taken_out_and_its_requests_go_elsewhere(
        three_paced_sims: list[SimProcess], fault_gateway: GatewayProcess) -> None:
    hung = three_paced_sims[1]
    kinds = await streams_through_a_fault(fault_gateway, hung.pause, hung)
    # the streams it was serving ended with the error event after the idle timeout
    assert kinds["error_event"] >= 1, kinds
    wait_until(lambda: not replica_healthy(fault_gateway, "s1"), 10, "s1 out of rotation")
    hung.resume()
    wait_until(lambda: replica_healthy(fault_gateway, "s1"), 30, "s1 back after its trial")


def sim_metric(sim: SimProcess, name: str, label: str = "") -> float:
    text = httpx.get(sim.base_url + "/metrics").text
    pattern = re.compile(rf"^{re.escape(name)}{{[^}}]*{re.escape(label)}[^}}]*}} (\S+)$", re.MULTILINE)
    return sum(float(value) for value in pattern.findall(text))


async def test_a_non_streaming_client_that_leaves_aborts_the_upstream_request() -> None:
    # 2000 tokens at 50 ms each: the answer would take 100 s, and its status
    # line (vLLM sends it with the whole answer) would come only then.
    with running_sims([sim_args(0, "--time-scale", "1", "--decode-per-seq", "0.05")]) as sims:
        sim = sims[0]
        with running_gateway(gateway_settings(sims)) as gw:
            async with httpx.AsyncClient(timeout=120) as client:
                body = {"model": MODEL, "max_tokens": 2000, "ignore_eos": True,
                        "messages": [{"role": "user", "content": "a long answer please"}]}
                tasks = [asyncio.ensure_future(client.post(gw.url + "/v1/chat/completions",
                                                           json=body)) for _ in range(4)]
                await eventually(lambda: sim_metric(sim, "vllm:num_requests_running") == 4,
                                 30, "four requests running on the replica")
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            await eventually(lambda: sim_metric(sim, "vllm:num_requests_running") == 0, 30,
                             "the replica's running requests aborted")
            aborted = sim_metric(sim, "vllm:request_success_total", 'finished_reason="abort"')
            assert aborted == 4


async def test_sigterm_under_load_ends_every_stream_complete_or_with_an_error_event() -> None:
    with running_sims([paced(i) for i in range(2)]) as sims:
        gw = GatewayProcess(gateway_settings(sims, drain_seconds=3.0))
        gw.start()
        try:
            client = client_of(gw)
            started: list[int] = []
            short = [asyncio.ensure_future(one_stream(client, i, 30, started)) for i in range(15)]
            long = [asyncio.ensure_future(one_stream(client, 100 + i, 5000, started))
                    for i in range(15)]
            await eventually(lambda: len(started) == 30, 60, "every stream started")
            assert gw.proc is not None
            os.kill(gw.proc.pid, signal.SIGTERM)
            async with httpx.AsyncClient(timeout=10) as probe:
                ready = await probe.get(gw.url + "/ready")
                assert ready.status_code == 503
                refused = await probe.post(gw.url + "/v1/chat/completions", json={
                    "model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
            assert refused.status_code == 503
            assert refused.headers["retry-after"]
            assert refused.json()["error"]["code"] == "gateway_draining"
            short_kinds = Counter(r.kind for r in await asyncio.gather(*short))
            long_kinds = Counter(r.kind for r in await asyncio.gather(*long))
            assert short_kinds == {"complete": 15}
            assert long_kinds == {"error_event": 15}
            assert await asyncio.to_thread(gw.proc.wait, 60) == 0
            await client.close()
        finally:
            gw.stop()


# --- slow clients ---------------------------------------------------------------------

SERVER = {"header_timeout": 1.0, "body_timeout": 1.0, "keep_alive": 1.0}
GUARD = 30.0
"""Seconds a socket read may block in these tests: a hang guard, far above the deadlines."""


@pytest.fixture(scope="module")
def guarded_gateway() -> Iterator[GatewayProcess]:
    with running_sims([sim_args(0)]) as sims:
        gw = GatewayProcess(gateway_settings(sims, server=SERVER))
        try:
            yield gw.start()
        finally:
            gw.stop()


def connect(gw: GatewayProcess) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", gw.port))
    sock.settimeout(GUARD)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    with sock:
        while chunk := sock.recv(65536):
            data += chunk
    return data


def openai_error(answer: bytes, status: int) -> dict:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d" % status), answer[:200]
    error = orjson.loads(body)["error"]
    assert error["message"] and error["type"]
    return error


REQUEST_HEAD = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
                b"Content-Type: application/json\r\n")


def test_partial_headers_get_a_408_and_the_connection_closed(guarded_gateway) -> None:
    sock = connect(guarded_gateway)
    sock.sendall(REQUEST_HEAD)
    openai_error(read_until_closed(sock), 408)


def trickle(sock: socket.socket, data: bytes, pause: float) -> int:
    """Send ``data`` a byte at a time, ``pause`` seconds apart (the slow client
    itself, not a synchronisation), until the server answers; the bytes sent."""
    for sent in range(len(data)):
        sock.sendall(data[sent:sent + 1])
        readable, _, _ = select.select([sock], [], [], pause)
        if readable:
            return sent + 1
    return len(data)


def test_headers_trickled_a_byte_at_a_time_are_cut_at_the_header_deadline(
        guarded_gateway) -> None:
    sock = connect(guarded_gateway)
    headers = REQUEST_HEAD * 20   # 1,400 bytes at 10 a second: far past the deadline
    assert trickle(sock, headers, 0.1) < len(headers)
    openai_error(read_until_closed(sock), 408)


def test_a_body_shorter_than_its_content_length_gets_a_408(guarded_gateway) -> None:
    sock = connect(guarded_gateway)
    sock.sendall(REQUEST_HEAD + b"Content-Length: 1000\r\n\r\n" + b'{"model": "')
    error = openai_error(read_until_closed(sock), 408)
    assert "body" in error["message"]


def test_a_connection_sending_only_crlfs_is_closed(guarded_gateway) -> None:
    sock = connect(guarded_gateway)
    crlfs = b"\r\n" * 1000
    assert trickle(sock, crlfs, 0.01) < len(crlfs)
    openai_error(read_until_closed(sock), 408)


def test_an_idle_connection_is_closed(guarded_gateway) -> None:
    sock = connect(guarded_gateway)
    openai_error(read_until_closed(sock), 408)


def test_an_idle_keep_alive_connection_is_closed_after_its_answer(guarded_gateway) -> None:
    sock = connect(guarded_gateway)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: gw\r\n\r\n")
    answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 200")
    assert answer.count(b"HTTP/1.1") == 1


def test_a_malformed_request_gets_an_openai_shaped_400(guarded_gateway) -> None:
    sock = connect(guarded_gateway)
    sock.sendall(b"GET / HTTP/1.1\r\nHost: gw\r\nContent-Length: x\r\n\r\n")
    openai_error(read_until_closed(sock), 400)


def test_the_gateway_still_serves_after_the_slow_clients(guarded_gateway) -> None:
    client = openai.OpenAI(base_url=guarded_gateway.url + "/v1", api_key="x", max_retries=0)
    reply = client.chat.completions.create(model=MODEL, max_tokens=4,
                                           messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content is not None


def test_over_the_connection_limit_new_requests_get_an_openai_shaped_503() -> None:
    limit = 4
    with running_sims([sim_args(0)]) as sims, running_gateway(gateway_settings(
            sims, server={"max_connections": limit, "header_timeout": GUARD})) as gw:
        held = [connect(gw) for _ in range(limit)]   # idle: each holds a connection
        try:
            sock = connect(gw)
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: gw\r\n\r\n")
            answer = read_until_closed(sock)
            assert b"retry-after: 1" in answer.lower()
            assert openai_error(answer, 503)["code"] == "too_many_connections"
        finally:
            for each in held:
                each.close()
        wait_until(lambda: httpx.get(gw.url + "/health").status_code == 200, GUARD,
                   "served again once the held connections are gone")
