"""A sim told to hang or crash on heavy requests does so, and only on those
(``engine.sim.faults``): real sim processes, spoken to over HTTP."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from tests.support.sim import REPO_ROOT, running_sim
from tests.support.waiting import wait_until

from .conftest import MODEL, sim_args

LOOK = 2.0
"""Seconds a test waits for an answer that must not come (the hang it observes)."""
GUARD = 30.0


def chat(**extra: object) -> dict:
    return {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}],
            **extra}


def unanswered(client: httpx.Client, path: str, body: dict | None = None) -> bool:
    try:
        if body is None:
            client.get(path, timeout=LOOK)
        else:
            client.post(path, json=body, timeout=LOOK)
    except httpx.ReadTimeout:
        return True
    return False


HEAVY = {"n": 9, "max_tokens": 200_000, "logprobs": 10, "messages": 600, "tools": 65}


def heavy(field: str) -> dict:
    if field == "messages":
        return chat(messages=[{"role": "user", "content": "x"}] * HEAVY[field])
    if field == "tools":
        return chat(tools=[{"type": "function", "function": {"name": f"t{i}"}}
                           for i in range(HEAVY[field])])
    return chat(**{field: HEAVY[field]})


RULES = "n>8,max_tokens>100000,logprobs>5,messages>500,tools>64"


@pytest.mark.parametrize("field", HEAVY)
def test_a_request_over_a_rule_hangs_and_the_rest_is_served(field: str) -> None:
    with running_sim(*sim_args(0, "--hang-on", RULES)) as sim, \
            httpx.Client(base_url=sim.base_url, timeout=GUARD) as client:
        assert unanswered(client, "/v1/chat/completions", heavy(field))
        assert client.post("/v1/chat/completions", json=chat(n=2)).status_code == 200
        assert client.get("/health").status_code == 200


def test_a_replica_wedged_by_a_request_answers_nothing_after_it() -> None:
    with running_sim(*sim_args(0, "--hang-on", "n>8", "--hang-scope", "replica")) as sim, \
            httpx.Client(base_url=sim.base_url, timeout=GUARD) as client:
        assert client.get("/health").status_code == 200
        assert unanswered(client, "/v1/completions", {"model": MODEL, "prompt": "x", "n": 100})
        assert unanswered(client, "/health")
        assert unanswered(client, "/v1/chat/completions", chat())


def test_a_replica_told_to_crash_exits_holding_the_request() -> None:
    with running_sim(*sim_args(0, "--crash-on", "n>1000")) as sim, \
            httpx.Client(base_url=sim.base_url, timeout=GUARD) as client:
        assert client.post("/v1/chat/completions", json=chat(n=3)).status_code == 200
        with pytest.raises(httpx.TransportError):
            client.post("/v1/chat/completions", json=chat(n=1_000_000_000))
        wait_until(lambda: not sim.running, GUARD, "the sim process gone")


def test_a_bad_rule_stops_the_sim_at_start_up() -> None:
    done = subprocess.run([sys.executable, "-m", "engine.sim", "--hang-on", "n=8"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=GUARD,
                          check=False)
    assert done.returncode == 2 and "FIELD>NUMBER" in done.stderr
