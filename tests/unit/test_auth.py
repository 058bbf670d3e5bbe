"""Client keys, tenants and per-key limits (``gateway.auth.keys``), through the app against
fake replicas, and the key store's own rules with an injected clock."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import yaml
from asgi_lifespan import LifespanManager

from gateway.auth.keys import (
    KeyFileError,
    KeyStore,
    exposure_warning,
    parse_keys,
    tenant_salt,
)
from gateway.config import load_settings
from gateway.errors import RateLimited, Unauthenticated
from gateway.server.app import create_app
from tests.support.api_keys import KeyFileEntry, write_keys
from tests.support.waiting import eventually_async

from .fake_replica import FakeReplica

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello " * 40}]}
SECRET = "test-salt-secret"
KEYS: list[KeyFileEntry] = [
    {"key": "sk-alpha-0001", "tenant": "alpha"},
    {"key_sha256": hashlib.sha256(b"sk-beta-00002").hexdigest(), "tenant": "beta"},
    {"key": "sk-admin-0003", "tenant": "ops", "admin": True},
]


@asynccontextmanager
async def gateway(replica: FakeReplica, keys_file: str | None, **settings: object
                  ) -> AsyncIterator[httpx.AsyncClient]:
    overrides = {"replicas": [{"id": replica.name, "url": f"http://{replica.name}",
                               "model": replica.model}],
                 "health_interval": 3600.0, "api_keys": keys_file,
                 "tenant_salt_secret": SECRET, "policy": "prefix", **settings}
    app = create_app(load_settings(overrides=overrides, env={}),
                     transport=lambda rid: replica.transport())
    async with LifespanManager(app) as manager, httpx.AsyncClient(
            transport=httpx.ASGITransport(app=manager.app), base_url="http://gw") as client:
        yield client


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


# -- the key file ------------------------------------------------------------------------


@pytest.mark.parametrize(("entries", "problem"), [
    ({"key": "sk-alpha-0001"}, "list"),
    ([{"tenant": "a"}], "exactly one of key and key_sha256"),
    ([{"key": "sk-alpha-0001", "key_sha256": "0" * 64, "tenant": "a"}], "exactly one"),
    ([{"key": "sk-alpha-0001", "tenant": "a", "rpm": 3}], "rpm: unknown key"),
    ([{"key": "sk-alpha-0001", "tenant": "a"}, {"key": "sk-alpha-0001", "tenant": "b"}],
     "entry 1: the same key"),
    ([{"key": "sk-alpha-0001", "tenant": "a", "max_concurrency": 0}], "max_concurrency"),
    ([{"key": "sk-alpha-0001", "tenant": "a\x00client"}], "control characters"),
    ([{"key": "short", "tenant": "a"}], "at least 8"),
])
def test_a_bad_key_file_names_the_entry_and_the_problem(entries: object, problem: str) -> None:
    with pytest.raises(KeyFileError, match=problem):
        parse_keys(yaml.safe_dump(entries), b"s")


def test_keys_are_kept_only_as_digests(tmp_path: Path) -> None:
    store = KeyStore(write_keys(tmp_path / "keys.yaml", KEYS), SECRET)
    assert store.authenticate("sk-alpha-0001").tenant == "alpha"
    assert store.authenticate("sk-beta-00002").tenant == "beta"
    assert "sk-alpha-0001" not in repr(vars(store))
    with pytest.raises(Unauthenticated):
        store.authenticate("sk-alpha-0002")


def test_a_broken_file_keeps_the_last_good_keys_and_a_fixed_one_is_taken(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "keys.yaml"
    store = KeyStore(write_keys(path, KEYS), SECRET)
    path.write_text("- key: [unclosed", encoding="utf-8")
    assert not store.reload()
    assert "keeping the 3 keys" in caplog.text
    assert store.authenticate("sk-alpha-0001").tenant == "alpha"
    write_keys(path, [{"key": "sk-gamma-0004", "tenant": "gamma"}])
    assert store.reload()
    assert store.authenticate("sk-gamma-0004").tenant == "gamma"
    with pytest.raises(Unauthenticated):
        store.authenticate("sk-alpha-0001")


def test_limits_refill_over_a_minute_and_say_when_to_retry(tmp_path: Path) -> None:
    now = [0.0]
    store = KeyStore(write_keys(tmp_path / "k.yaml", [
        {"key": "sk-limited-01", "tenant": "t", "requests_per_minute": 2,
         "tokens_per_minute": 600, "max_concurrency": 2}]), SECRET, clock=lambda: now[0])
    principal = store.authenticate("sk-limited-01")
    first, second = store.admit(principal), store.admit(principal)
    with pytest.raises(RateLimited, match="2 concurrent") as busy:
        store.admit(principal)
    assert busy.value.headers["retry-after"] == "1"
    first.release()
    with pytest.raises(RateLimited, match="2 requests per minute") as rpm:
        store.admit(principal)
    assert rpm.value.headers["retry-after"] == "30"  # one request every 30 s
    now[0] = 30.0
    third = store.admit(principal)
    # Tokens: 500 charged up front, 100 really used: 400 come back when it is answered.
    third.charge(500, lambda: 100)
    with pytest.raises(RateLimited, match="600 tokens per minute") as tpm:
        second.charge(200, lambda: None)
    assert tpm.value.headers["retry-after"] == "10"  # 100 short, 10 tokens a second
    third.release()
    second.charge(450, lambda: None)
    with pytest.raises(RateLimited, match="more than this key's limit") as huge:
        second.charge(601, lambda: None)
    assert "retry-after" not in huge.value.headers


def test_salts_are_per_tenant_and_a_client_salt_cannot_reach_another_tenant() -> None:
    secret = b"s"
    assert tenant_salt(secret, "a") == tenant_salt(secret, "a")
    assert tenant_salt(secret, "a") != tenant_salt(secret, "b")
    assert tenant_salt(secret, "a") != tenant_salt(b"other", "a")
    # Whatever salt a client of tenant a picks, it never lands on b's salt.
    picks = ["", "b", tenant_salt(secret, "b"), "pg-" + "0" * 32]
    assert tenant_salt(secret, "b") not in {tenant_salt(secret, "a", p) for p in picks}


@pytest.mark.parametrize(("host", "warns"), [
    ("127.0.0.1", False), ("localhost", False), ("::1", False),
    ("0.0.0.0", True), ("10.0.0.5", True), ("gateway.internal", True)])
def test_a_gateway_open_beyond_loopback_without_keys_warns(host: str, warns: bool) -> None:
    warning = exposure_warning(host, None)
    assert warning is not None and ("beyond this machine" in warning) == warns
    assert "prefix caches" in warning and "timing side channel" in warning  # keys or not
    assert exposure_warning(host, "keys.yaml") is None


# -- through the app ---------------------------------------------------------------------


async def test_requests_need_a_known_key_in_any_of_the_accepted_headers(
        tmp_path: Path) -> None:
    replica = FakeReplica("r")
    async with gateway(replica, write_keys(tmp_path / "k.yaml", KEYS)) as client:
        missing = await client.post("/v1/chat/completions", json=CHAT)
        wrong = await client.post("/v1/chat/completions", json=CHAT, headers=bearer("sk-nope-0000"))
        assert (missing.status_code, wrong.status_code) == (401, 401)
        assert missing.json()["error"]["type"] == "AuthenticationError"
        assert missing.json()["error"]["code"] == "missing_api_key"
        assert wrong.json()["error"]["code"] == "invalid_api_key"
        assert replica.requests == []
        basic = base64.b64encode(b"anyone:sk-alpha-0001").decode()
        for headers in (bearer("sk-alpha-0001"), {"x-api-key": "sk-beta-00002"},
                        {"authorization": f"Basic {basic}"}):
            assert (await client.post("/v1/chat/completions", json=CHAT,
                                      headers=headers)).status_code == 200
        # The client's key is the gateway's secret: the replica never sees it.
        for seen in replica.headers_seen:
            assert "sk-" not in repr(seen)
        assert (await client.get("/health")).status_code == 200
        assert (await client.get("/ready")).status_code == 200
        assert (await client.get("/v1/models")).status_code == 401


async def test_each_tenant_is_forwarded_with_its_own_salt(tmp_path: Path) -> None:
    replica = FakeReplica("r")
    async with gateway(replica, write_keys(tmp_path / "k.yaml", KEYS)) as client:
        await client.post("/v1/chat/completions", json=CHAT, headers=bearer("sk-alpha-0001"))
        await client.post("/v1/chat/completions", json=CHAT, headers=bearer("sk-beta-00002"))
        await client.post("/v1/chat/completions", json={**CHAT, "cache_salt": "mine"},
                          headers=bearer("sk-alpha-0001"))
    salts = [body["cache_salt"] for body in replica.requests]
    assert salts == [tenant_salt(SECRET.encode(), "alpha"), tenant_salt(SECRET.encode(), "beta"),
                     tenant_salt(SECRET.encode(), "alpha", "mine")]
    assert len(set(salts)) == 3


async def test_only_generating_routes_get_a_salt_and_a_token_charge(tmp_path: Path) -> None:
    replica = FakeReplica("r")
    keys: list[KeyFileEntry] = [*KEYS, {"key": "sk-tokens-001", "tenant": "alpha", "tokens_per_minute": 100}]
    async with gateway(replica, write_keys(tmp_path / "k.yaml", keys)) as client:
        embedded = await client.post("/v1/embeddings", json={"model": "m", "input": "hello"},
                                     headers=bearer("sk-tokens-001"))
        assert embedded.status_code == 200  # a generation of 256 tokens would be refused
    assert replica.requests == [{"model": "m", "input": "hello"}]
    assert "sk-" not in repr(replica.headers_seen)


@pytest.mark.parametrize("keyed", [False, True])
async def test_the_linter_judges_the_clients_body_not_the_tenants_salt(
        tmp_path: Path, keyed: bool) -> None:
    chat = {"model": "m", "messages": [
        {"role": "system", "content": "You are the support assistant of a shop. " * 8},
        {"role": "user", "content": "Where is my parcel?"}]}
    headers = bearer("sk-alpha-0001") if keyed else {}
    keys_file = write_keys(tmp_path / "k.yaml", KEYS) if keyed else None
    async with gateway(FakeReplica("r"), keys_file) as client:
        seen: list[str | None] = []

        async def linted() -> bool:
            answer = await client.post("/v1/chat/completions", json=chat, headers=headers)
            seen.append(answer.headers.get("x-prefixgate-lint"))
            return seen[-1] is not None

        await eventually_async(linted, 30, "the prefix linted")
    assert seen[-1] == "0"  # the tenant's salt is the gateway's, not a finding


async def test_a_body_nested_past_the_json_encoders_limit_is_salted_as_sent(
        tmp_path: Path) -> None:
    replica = FakeReplica("r")
    deep: object = "bottom"
    for _ in range(300):
        deep = [deep]
    body = {**CHAT, "cache_salt": "mine", "x-deep": deep}
    async with gateway(replica, write_keys(tmp_path / "k.yaml", KEYS)) as client:
        answer = await client.post("/v1/chat/completions", json=body,
                                   headers=bearer("sk-alpha-0001"))
    assert answer.status_code == 200
    assert replica.requests[0]["cache_salt"] == tenant_salt(SECRET.encode(), "alpha", "mine")
    assert replica.requests[0]["x-deep"] == deep


async def test_admin_routes_need_an_admin_key(tmp_path: Path) -> None:
    async with gateway(FakeReplica("r"), write_keys(tmp_path / "k.yaml", KEYS)) as client:
        for path in ("/admin/replicas", "/admin/drift", "/admin/lint", "/dashboard"):
            anonymous = await client.get(path)
            assert anonymous.status_code == 401, path
            assert anonymous.headers["www-authenticate"].startswith("Basic")
            denied = await client.get(path, headers=bearer("sk-alpha-0001"))
            assert denied.status_code == 403, path
            assert denied.json()["error"]["type"] == "PermissionDeniedError"
            assert (await client.get(path, headers=bearer("sk-admin-0003"))).status_code == 200
        metrics = await client.get("/metrics")
        assert metrics.status_code == 200  # metrics_auth: open, the default
        assert 'prefixgate_auth_rejections_total{reason="not_admin"} 4.0' in metrics.text
        assert 'prefixgate_auth_rejections_total{reason="missing_key"} 4.0' in metrics.text


@pytest.mark.parametrize(("metrics_auth", "anonymous", "user"), [
    ("key", 401, 200), ("admin", 401, 403)])
async def test_metrics_can_need_a_key(tmp_path: Path, metrics_auth: str, anonymous: int,
                                      user: int) -> None:
    async with gateway(FakeReplica("r"), write_keys(tmp_path / "k.yaml", KEYS),
                       metrics_auth=metrics_auth) as client:
        assert (await client.get("/metrics")).status_code == anonymous
        assert (await client.get("/metrics", headers=bearer("sk-alpha-0001"))).status_code == user
        assert (await client.get("/metrics", headers=bearer("sk-admin-0003"))).status_code == 200


async def test_without_keys_the_gateway_is_open_and_forwards_as_before() -> None:
    replica = FakeReplica("r")
    async with gateway(replica, None) as client:
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        assert (await client.get("/admin/replicas")).status_code == 200
    assert "cache_salt" not in replica.requests[0]


async def test_tokens_are_charged_up_front_and_settled_from_usage(tmp_path: Path) -> None:
    # ~80 body bytes / 4 + max_tokens 700: about 760 charged, 8 used (the fake's usage).
    keys: list[KeyFileEntry] = [{"key": "sk-tokens-001", "tenant": "t", "tokens_per_minute": 1000}]
    body = {**CHAT, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 700}
    async with gateway(FakeReplica("r"), write_keys(tmp_path / "k.yaml", keys)) as client:
        for _ in range(3):  # without the correction the second would be refused
            answer = await client.post("/v1/chat/completions", json=body,
                                       headers=bearer("sk-tokens-001"))
            assert answer.status_code == 200
        # Refused before any replica was tried: nothing used, the whole charge comes back.
        for _ in range(2):
            unknown = await client.post("/v1/chat/completions", json={**body, "model": "nope"},
                                        headers=bearer("sk-tokens-001"))
            assert unknown.status_code == 404
        assert (await client.post("/v1/chat/completions", json=body,
                                  headers=bearer("sk-tokens-001"))).status_code == 200
        huge = await client.post("/v1/chat/completions", json={**body, "max_tokens": 5000},
                                 headers=bearer("sk-tokens-001"))
    assert huge.status_code == 429
    assert huge.json()["error"]["type"] == "RateLimitError"


async def test_a_batch_of_chats_is_charged_for_every_conversations_answer(
        tmp_path: Path) -> None:
    # Eight conversations of max_tokens 200 may generate 1,600 tokens: over the budget.
    keys: list[KeyFileEntry] = [{"key": "sk-tokens-001", "tenant": "t", "tokens_per_minute": 1000}]
    one = [{"role": "user", "content": "hi"}]
    body = {"model": "m", "max_tokens": 200}
    async with gateway(FakeReplica("r"), write_keys(tmp_path / "k.yaml", keys)) as client:
        small = await client.post("/v1/chat/completions/batch",
                                  json={**body, "messages": [one, one]},
                                  headers=bearer("sk-tokens-001"))
        large = await client.post("/v1/chat/completions/batch",
                                  json={**body, "messages": [one] * 8},
                                  headers=bearer("sk-tokens-001"))
    assert small.status_code == 200
    assert large.status_code == 429, large.text
