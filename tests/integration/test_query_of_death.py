"""One request that stops the replica holding it must not take down the fleet.

Simulated replicas told that a chat with ``n`` over a limit is a query of
death (``engine.sim.faults``): it kills the process holding it. Retrying such a request on
the next replica, and the next, used to take every replica down with it.
"""

from __future__ import annotations

import re

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionUserMessageParam

from tests.support.gateway import GatewayProcess
from tests.support.waiting import wait_until

from .conftest import MODEL, gateway_settings, running_sims, sim_args

DEATH: ChatCompletionUserMessageParam = {"role": "user", "content": "give me a billion answers"}


def healthy(gw: GatewayProcess) -> dict[str, bool]:
    text = httpx.get(gw.url + "/metrics").text
    found = re.findall(r'^prefixgate_replica_healthy\{replica="([^"]+)"\} (\S+)$', text, re.MULTILINE)
    return {replica: float(value) == 1.0 for replica, value in found}


def not_retried(gw: GatewayProcess) -> float:
    text = httpx.get(gw.url + "/metrics").text
    return sum(float(v) for v in re.findall(
        r'^prefixgate_requests_not_retried_total\{replica="[^"]+"\} (\S+)$', text, re.MULTILINE))


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_query_of_death_that_crashes_its_replica_costs_that_replica_only(stream: bool) -> None:
    """The replica dies holding the request (its connection reset; the gateway's pooled
    connection, then a fresh one refused). A wedged replica: test_fuzz's own case."""
    with running_sims([sim_args(i, "--crash-on", "n>8") for i in range(3)]) as sims:
        gw = GatewayProcess(gateway_settings(sims, policy="prefix",
                                             timeouts={"probe": 0.5})).start()
        try:
            client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0,
                                   timeout=60)
            with pytest.raises(openai.APIStatusError) as caught:
                answer = client.chat.completions.create(
                    model=MODEL, messages=[DEATH], n=1_000_000_000, max_tokens=4,
                    stream=stream)
                if stream:
                    assert isinstance(answer, openai.Stream)
                    list(answer)
            assert caught.value.status_code in (502, 504)
            assert "not retried on another replica" in caught.value.message
            wait_until(lambda: list(healthy(gw).values()).count(False) == 1, 15, "one replica out")
            assert not_retried(gw) == 1
            # the fleet goes on serving, on the replicas the request did not reach
            assert httpx.get(gw.url + "/ready").status_code == 200
            for i in range(6):
                reply = client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": f"hello {i}"}],
                    max_tokens=4)
                assert reply.choices[0].message.content is not None
            assert sum(healthy(gw).values()) == 2
        finally:
            gw.stop()


def broken_checks(gw: GatewayProcess, result: str) -> float:
    text = httpx.get(gw.url + "/metrics").text
    return sum(float(v) for v in re.findall(
        r'^prefixgate_replica_broken_checks_total\{replica="[^"]+",result="' + result
        + r'"\} (\S+)$',
        text, re.MULTILINE))


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_replica_that_cuts_one_answer_short_stays_in_rotation(stream: bool) -> None:
    """A replica's bug for one request (its answer cut off mid-body) while it serves the
    rest: that client gets an error, and no one else notices. Ejecting the replica for
    it, as the gateway did, turned one request into an outage of a one-replica fleet.
    A stream is cut in the middle of its second event: the client gets the first and
    then an ``openai`` error that says why (half an event and the error event relayed as
    they came made one line of broken JSON, a ``JSONDecodeError`` in the client)."""
    with running_sims([sim_args(0, "--cut-on", "n>8")]) as sims:
        gw = GatewayProcess(gateway_settings(sims, policy="prefix")).start()
        try:
            client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0,
                                   timeout=60)
            received: list[object] = []
            with pytest.raises(openai.APIError) as raised:
                answer = client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "cut me"}], n=9,
                    max_tokens=4, stream=stream)
                if stream:
                    assert isinstance(answer, openai.Stream)
                    received.extend(answer)
            if stream:
                assert len(received) == 1  # the first event whole, the half second never
                assert "failed mid-stream" in raised.value.message
            try:
                wait_until(lambda: broken_checks(gw, "healthy") == 1, 15, "the replica checked")
            except AssertionError as exc:  # say why: a failed check, or none started
                raise AssertionError(f"{exc}; failed checks {broken_checks(gw, 'failed')}; "
                                     f"the gateway's log ends:\n{gw.log()[-4000:]}") from None
            assert list(healthy(gw).values()) == [True]
            assert broken_checks(gw, "failed") == 0
            for i in range(3):  # and the next clients are served at once
                reply = client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": f"hello {i}"}],
                    max_tokens=4)
                assert reply.choices[0].message.content is not None
        finally:
            gw.stop()
