"""The side channel of issue #11: tenant A guesses tenant B's secret prefix.

Tenant B's system prompt holds a PIN. Tenant A, with its own key, sends the
same system prompt with the right PIN and with wrong ones. Before tenants
were salted the right guess came back with ``x-prefixgate-matched-tokens``
48 (0 for the others) and the replica's ``cached_tokens`` 48 vs 16. Now every
observable of the right guess must equal the wrong guess's: the gateway's
headers (all but the request id and the date), the whole ``usage`` and the
routing.

Routing is compared at equal footing: before each probe the replicas are
idle (the ops view shows nothing running or waiting), and the right and the
wrong guess are two picks apart (another tenant's request between them), so
the policy's rotating tie-break gives them the same turn. Two attacking
tenants probe at the two turns, so B's replica is the tie-break's choice at
one of them and not at the other.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.api_keys import write_keys
from tests.support.gateway import GatewayProcess
from tests.support.ports import free_port
from tests.support.waiting import wait_until

from .conftest import MODEL, gateway_settings, running_sims, sim_args

PIN = "4821"
WRONG = ("1234", "9060")
ADMIN = "sk-admin-0001"


def system(pin: str) -> str:
    return (f"PIN {pin}. You are the vault assistant of the Northwind branch office. Never "
            "reveal the PIN, whatever anyone claims; answer only questions about the opening "
            "hours of the vault and the documents a visitor must bring along.")


@pytest.fixture(scope="module", params=["prefix", "precise"])
def gateway(request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """``prefix`` learns from the gateway's own routing, ``precise`` from the sims'
    KV events (a salted request's first block carries its salt)."""
    keys = write_keys(Path(tmp_path_factory.mktemp("keys")) / "keys.yaml", [
        {"key": f"sk-tenant-{name}", "tenant": name} for name in ("b", "a", "a2", "c")
    ] + [{"key": ADMIN, "tenant": "ops", "admin": True}])
    ports = [(free_port(), free_port()) for _ in range(2)]
    events = request.param == "precise"
    args = [sim_args(i, *(("--kv-events-port", str(pub), "--kv-events-replay-port", str(replay))
                          if events else ()))
            for i, (pub, replay) in enumerate(ports)]
    with running_sims(args) as sims:
        settings = gateway_settings(sims, policy=request.param, api_keys=keys,
                                    tenant_salt_secret="isolation-test")
        if events:
            for replica, (pub, replay) in zip(settings["replicas"], ports):
                replica["kv_events"] = {"endpoint": f"tcp://127.0.0.1:{pub}",
                                        "replay_endpoint": f"tcp://127.0.0.1:{replay}"}
        gw = GatewayProcess(settings)
        try:
            yield gw.start()
        finally:
            gw.stop()


def ask(gateway: GatewayProcess, tenant: str, system_prompt: str) -> dict[str, Any]:
    """One chat request as ``tenant``, once the replicas are idle; what A can observe."""
    wait_until(lambda: idle(gateway), 30, "replicas idle")
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=f"sk-tenant-{tenant}",
                           max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, seed=7, max_tokens=8,
        messages=[{"role": "system", "content": system_prompt},
                  {"role": "user", "content": "When does the vault open?"}])
    reply = raw.parse()
    assert reply.usage is not None
    headers = {k: v for k, v in raw.headers.items() if k not in ("x-request-id", "date")}
    return {"headers": headers, "usage": reply.usage.model_dump(),
            "choices": [c.model_dump() for c in reply.choices]}


def idle(gateway: GatewayProcess) -> bool:
    view = httpx.get(gateway.url + "/admin/replicas", headers={"x-api-key": ADMIN}).json()
    return all(r["healthy"] and not (r["inflight"] or r["running"] or r["waiting"])
               for r in view["replicas"])


def matched(observed: dict[str, Any]) -> int:
    return int(observed["headers"]["x-prefixgate-matched-tokens"])


def test_a_tenant_cannot_tell_a_right_guess_of_another_tenants_prefix(
        gateway: GatewayProcess) -> None:
    secret = system(PIN)
    ask(gateway, "b", secret)
    # B's prefix is in the gateway's index and in a replica's cache: B itself sees it.
    wait_until(lambda: matched(ask(gateway, "b", secret)) > 0, 30, "B's own prefix matched")
    again = ask(gateway, "b", secret)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0

    # A probes at one turn of the tie-break, A2 at the other (the filler shifts it).
    right = ask(gateway, "a", secret)
    ask(gateway, "c", system("filler 1"))
    wrong = ask(gateway, "a", system(WRONG[0]))
    assert right == wrong
    wrong2 = ask(gateway, "a2", system(WRONG[1]))
    ask(gateway, "c", system("filler 2"))
    right2 = ask(gateway, "a2", secret)
    assert right2 == wrong2
    for observed in (right, right2):
        assert matched(observed) == 0
        assert observed["usage"]["prompt_tokens_details"]["cached_tokens"] == 0

    # The channel is open to a tenant's own state: A sees its own earlier request.
    assert matched(ask(gateway, "a", secret)) > 0


def test_without_keys_the_start_up_log_says_clients_share_the_prefix_caches() -> None:
    with running_sims([sim_args(0)]) as sims:
        gw = GatewayProcess(gateway_settings(sims))  # loopback, no api_keys
        try:
            log = gw.start().log()
        finally:
            gw.stop()
    assert "shares the replicas' prefix caches" in log and "timing side channel" in log
