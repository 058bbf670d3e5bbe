"""Client keys against the real gateway process and sim replicas, with the official
openai client as the caller: 401 for missing, wrong and revoked keys, 429 with
Retry-After for each per-key limit, 403 on admin routes for other keys, and a
key file edited while the gateway runs."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam

from tests.support.api_keys import KeyFileEntry, write_keys
from tests.support.gateway import GatewayProcess
from tests.support.waiting import wait_until

from .conftest import MODEL, gateway_settings, running_sims, sim_args

CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say something."}]
KEYS: list[KeyFileEntry] = [
    {"key": "sk-user-0001", "tenant": "alpha"},
    {"key": "sk-revoke-01", "tenant": "alpha"},
    {"key": "sk-admin-001", "tenant": "ops", "admin": True},
    {"key": "sk-rpm-00001", "tenant": "beta", "requests_per_minute": 1},
    {"key": "sk-tpm-00001", "tenant": "beta", "tokens_per_minute": 1000},
    {"key": "sk-conc-0001", "tenant": "beta", "max_concurrency": 1},
    {"key": "sk-gamma-001", "tenant": "gamma"},
]


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "keys.yaml"
    write_keys(path, KEYS)
    return path


@pytest.fixture(scope="module")
def gateway(keys_file: Path) -> Iterator[GatewayProcess]:
    # Real time (--time-scale 1): a long stream stays open while the test looks.
    with running_sims([sim_args(i, "--time-scale", "1") for i in range(2)]) as sims:
        gw = GatewayProcess(gateway_settings(sims, policy="prefix", api_keys=str(keys_file),
                                             api_keys_reload_seconds=0.2))
        try:
            yield gw.start()
        finally:
            gw.stop()


def client(gateway: GatewayProcess, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0)


def chat(gateway: GatewayProcess, key: str, **extra: Any) -> ChatCompletion:
    return client(gateway, key).chat.completions.create(model=MODEL, messages=CHAT, **extra)


def retry_after(error: openai.APIStatusError) -> int:
    return int(error.response.headers["retry-after"])


def test_a_known_key_is_served(gateway: GatewayProcess) -> None:
    assert chat(gateway, "sk-user-0001", seed=1).choices[0].message.content


@pytest.mark.parametrize("key", [None, "sk-user-0002", "sk-USER-0001"])
def test_missing_and_wrong_keys_are_refused(gateway: GatewayProcess, key: str | None) -> None:
    without = {"Authorization": openai.Omit()} if key is None else {}
    with pytest.raises(openai.AuthenticationError) as refused:
        chat(gateway, key or "unused", extra_headers=without)
    assert refused.value.status_code == 401
    assert refused.value.body["type"] == "AuthenticationError"  # type: ignore[index]
    assert refused.value.code == ("missing_api_key" if key is None else "invalid_api_key")


def status_with_header(gateway: GatewayProcess, header: bytes) -> int:
    """``GET /v1/models`` with ``header`` sent byte for byte (a raw socket: clients
    refuse to send some of these bytes)."""
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=30) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n"
                     + header + b"\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1])


@pytest.mark.parametrize("around", [b" ", b"\t", b"\x85", b"\xa0", b"\xc2\xa0"])
def test_every_key_header_treats_what_surrounds_the_key_alike(gateway: GatewayProcess,
                                                              around: bytes) -> None:
    key = KEYS[0]["key"].encode()
    forms = {name: status_with_header(gateway, header + key + around)
             for name, header in (("bearer", b"Authorization: Bearer "),
                                  ("x-api-key", b"x-api-key: "))}
    # spaces and tabs are HTTP's own whitespace; the other bytes make another key
    assert forms == dict.fromkeys(forms, 200 if around in (b" ", b"\t") else 401)


def test_health_and_ready_stay_open(gateway: GatewayProcess) -> None:
    assert httpx.get(gateway.url + "/health").status_code == 200
    assert httpx.get(gateway.url + "/ready").status_code == 200


def test_admin_routes_refuse_other_keys(gateway: GatewayProcess) -> None:
    for path in ("/admin/replicas", "/admin/drift", "/dashboard"):
        assert httpx.get(gateway.url + path).status_code == 401
        other = httpx.get(gateway.url + path, headers={"authorization": "Bearer sk-user-0001"})
        assert other.status_code == 403
        assert other.json()["error"]["type"] == "PermissionDeniedError"
        admin = httpx.get(gateway.url + path, headers={"x-api-key": "sk-admin-001"})
        assert admin.status_code == 200


def test_an_admin_key_sees_the_drift_groups_tool_names(gateway: GatewayProcess) -> None:
    tools = [{"type": "function", "function": {"name": "lookup_vault_hours", "parameters": {
        "type": "object", "properties": {}}}}]
    chat(gateway, "sk-gamma-001", tools=tools, max_tokens=2)

    def drift() -> str:
        return httpx.get(gateway.url + "/admin/drift", timeout=10,
                         headers={"x-api-key": "sk-admin-001"}).text

    wait_until(lambda: "lookup_vault_hours" in drift(), what="the group, names shown to admins")


def test_requests_per_minute(gateway: GatewayProcess) -> None:
    chat(gateway, "sk-rpm-00001")
    with pytest.raises(openai.RateLimitError) as limited:
        chat(gateway, "sk-rpm-00001")
    assert 1 <= retry_after(limited.value) <= 60


def test_tokens_per_minute_are_settled_from_usage(gateway: GatewayProcess) -> None:
    # ~2,800 body bytes (700 estimated tokens) + max_tokens 8: passes the 1,000 budget;
    # what it really used (~700 prompt tokens, from usage) leaves too little for a second.
    long_prompt: list[ChatCompletionMessageParam] = [{"role": "user", "content": "word " * 700}]
    tpm = client(gateway, "sk-tpm-00001").chat.completions
    first = tpm.create(model=MODEL, messages=long_prompt, max_tokens=8)
    assert first.usage is not None and first.usage.prompt_tokens > 600
    with pytest.raises(openai.RateLimitError) as limited:
        tpm.create(model=MODEL, messages=long_prompt, max_tokens=8)
    assert retry_after(limited.value) >= 1
    # A small request still fits in what is left: the estimate was given back.
    assert tpm.create(model=MODEL, messages=CHAT, max_tokens=8).choices


def test_max_concurrency_counts_open_streams(gateway: GatewayProcess) -> None:
    conc = client(gateway, "sk-conc-0001")
    stream = conc.chat.completions.create(model=MODEL, messages=CHAT, stream=True,
                                          max_tokens=4000, extra_body={"ignore_eos": True})
    try:
        next(iter(stream))
        with pytest.raises(openai.RateLimitError) as limited:
            chat(gateway, "sk-conc-0001")
        assert retry_after(limited.value) >= 1
    finally:
        stream.close()

    def served_again() -> bool:
        try:
            chat(gateway, "sk-conc-0001", max_tokens=4)
        except openai.RateLimitError:
            return False
        return True

    wait_until(served_again, 30, "the closed stream's slot freed")


def test_a_key_file_change_takes_effect_without_a_restart(gateway: GatewayProcess,
                                                          keys_file: Path) -> None:
    assert chat(gateway, "sk-revoke-01", max_tokens=4).choices
    with pytest.raises(openai.AuthenticationError):
        chat(gateway, "sk-added-0001")
    kept = [k for k in KEYS if k["key"] != "sk-revoke-01"]
    write_keys(keys_file, [*kept, {"key": "sk-added-0001", "tenant": "gamma"}])

    def revoked() -> bool:
        try:
            chat(gateway, "sk-revoke-01", max_tokens=4)
        except openai.AuthenticationError:
            return True
        return False

    wait_until(revoked, 30, "the revoked key refused")
    assert chat(gateway, "sk-added-0001", max_tokens=4).choices
    # A broken file keeps the keys loaded before.
    keys_file.write_text("- key: [unclosed\n", encoding="utf-8")
    wait_until(lambda: "keeping the" in gateway.log(), 30, "the broken file logged")
    assert chat(gateway, "sk-added-0001", max_tokens=4).choices
    with pytest.raises(openai.AuthenticationError):
        chat(gateway, "sk-revoke-01")


def test_a_stored_response_is_its_tenants_only(gateway: GatewayProcess) -> None:
    owner, other = client(gateway, "sk-user-0001"), client(gateway, "sk-gamma-001")
    first = owner.responses.create(model=MODEL, input="Remember my PIN.", max_output_tokens=4)
    assert owner.responses.retrieve(first.id).id == first.id
    for attempt in (lambda: other.responses.retrieve(first.id),
                    lambda: other.responses.cancel(first.id),
                    lambda: other.responses.create(model=MODEL, input="What was it?",
                                                   previous_response_id=first.id,
                                                   max_output_tokens=4)):
        with pytest.raises(openai.NotFoundError) as refused:
            attempt()
        assert refused.value.body["message"] == (  # type: ignore[index]
            f"Response with id '{first.id}' not found.")
    # An id nobody made answers the same: the other tenant cannot tell the two apart.
    with pytest.raises(openai.NotFoundError) as unknown:
        other.responses.retrieve("resp_" + "0" * 32)
    assert unknown.value.status_code == 404
    follow = owner.responses.create(model=MODEL, input="What was it?",
                                    previous_response_id=first.id, max_output_tokens=4)
    assert follow.previous_response_id == first.id
