"""The gateway's own logic against fake replicas (httpx.MockTransport, ASGITransport)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
from asgi_lifespan import LifespanManager

from gateway.config import load_settings
from gateway.server.app import create_app

from .fake_replica import FakeReplica

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}


@asynccontextmanager
async def gateway(replicas: list[FakeReplica], model: str | None = None,
                  raise_app_exceptions: bool = True,
                  **settings: object) -> AsyncIterator[httpx.AsyncClient]:
    overrides = {"replicas": [{"id": r.name, "url": f"http://{r.name}", "model": model}
                              for r in replicas],
                 "health_interval": 3600.0, **settings}
    by_id = {r.name: r for r in replicas}
    app = create_app(load_settings(overrides=overrides, env={}),
                     transport=lambda rid: by_id[rid].transport())
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app,
                                        raise_app_exceptions=raise_app_exceptions)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            client.app = app  # type: ignore[attr-defined]
            yield client


def pool_of(client: httpx.AsyncClient):
    return client.app.gateway.pool  # type: ignore[attr-defined]


def assert_openai_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    return error


async def test_round_robin_spreads_and_tags_the_replica() -> None:
    a, b = FakeReplica("a"), FakeReplica("b")
    async with gateway([a, b], policy="round_robin") as client:
        served = [(await client.post("/v1/chat/completions", json=CHAT)).headers["x-prefixgate-replica"]
                  for _ in range(4)]
    assert sorted(served) == ["a", "a", "b", "b"]
    assert len(a.requests) == len(b.requests) == 2


async def test_body_is_forwarded_unchanged_with_request_id() -> None:
    a = FakeReplica("a")
    body = {**CHAT, "temperature": 0.3, "seed": 7, "ignore_eos": True, "stop": ["x"],
            "response_format": {"type": "json_object"}, "vendor_extra": {"k": [1, 2]}}
    async with gateway([a]) as client:
        response = await client.post("/v1/chat/completions", json=body,
                                     headers={"x-request-id": "req-123"})
    assert response.status_code == 200
    assert a.requests[0] == body
    assert a.headers_seen[0]["x-request-id"] == "req-123"
    assert response.headers["x-request-id"] == "req-123"


@pytest.mark.parametrize("payload,status,param", [
    (b"{not json", 400, None),
    (b"[]", 400, None),
    (b'{"model": ["m"], "messages": [{"role": "user", "content": "x"}]}', 400, "model"),
    (b'{"model": "nope", "messages": [{"role": "user", "content": "x"}]}', 404, "model"),
])
async def test_bad_input_gets_openai_error(payload: bytes, status: int, param: str | None) -> None:
    async with gateway([FakeReplica("a")]) as client:
        response = await client.post("/v1/chat/completions", content=payload)
    error = assert_openai_error(response, status)
    assert error["param"] == param


async def test_body_over_limit_is_413() -> None:
    async with gateway([FakeReplica("a")], max_body_bytes=1000) as client:
        big = {**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]}
        response = await client.post("/v1/chat/completions", json=big)
    assert_openai_error(response, 413)


async def test_replica_error_passes_through() -> None:
    a = FakeReplica("a", status=400)
    async with gateway([a]) as client:
        response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "replica says no"
    assert response.headers["x-prefixgate-replica"] == "a"


async def test_no_healthy_replica_is_503_with_retry_after() -> None:
    a = FakeReplica("a", up=False)
    async with gateway([a], model="m") as client:
        response = await client.post("/v1/chat/completions", json=CHAT)
        ready = await client.get("/ready")
    assert_openai_error(response, 503)
    assert response.headers["retry-after"] == "1"
    assert ready.status_code == 503


async def test_an_unknown_model_is_vllms_404_and_aliases_default_as_in_vllm() -> None:
    a, b = FakeReplica("a", aliases=("m-fast",)), FakeReplica("b", aliases=("m-fast",))
    no_model = {k: v for k, v in CHAT.items() if k != "model"}
    async with gateway([a, b]) as client:
        unknown = await client.post("/v1/chat/completions", json={**CHAT, "model": "nope"})
        default = await client.post("/v1/chat/completions", json=no_model)
    assert unknown.status_code == 404
    assert unknown.json() == {"error": {
        "message": "The model `nope` does not exist. Valid aliases: m, m-fast.",
        "type": "NotFoundError", "param": "model", "code": 404}}
    assert default.status_code == 200  # vLLM's first served name
    assert (a.requests + b.requests)[-1] == {**no_model, "model": "m"}


async def test_a_lora_adapter_is_not_a_second_model() -> None:
    """vLLM serves a request with no model by its base model, and names only base models
    as valid; an adapter's requests are routed (and rendered) as its base model's."""
    a = FakeReplica("a", adapters=("sql-lora",))
    no_model = {k: v for k, v in CHAT.items() if k != "model"}
    async with gateway([a]) as client:
        default = await client.post("/v1/chat/completions", json=no_model)
        adapter = await client.post("/v1/chat/completions", json={**CHAT, "model": "sql-lora"})
        unknown = await client.post("/v1/chat/completions", json={**CHAT, "model": "nope"})
        pool = pool_of(client)
    assert default.status_code == 200 and a.requests[0]["model"] == "m"
    assert adapter.status_code == 200 and a.requests[1]["model"] == "sql-lora"
    assert unknown.json()["error"]["message"].endswith("Valid aliases: m.")
    assert pool.tokenizer_root("sql-lora") == pool.tokenizer_root("m") == "/models/m"


async def test_an_adapter_loaded_at_run_time_is_served_at_once() -> None:
    """vLLM's /v1/load_lora_adapter goes to the replicas; the next request naming it is
    routed, not refused until the gateway's next models probe."""
    a = FakeReplica("a")
    async with gateway([a]) as client:
        a.adapters = ("sql-lora",)
        answer = await client.post("/v1/chat/completions", json={**CHAT, "model": "sql-lora"})
        unknown = [await client.post("/v1/chat/completions", json={**CHAT, "model": "nope"})
                   for _ in range(2)]
    assert answer.status_code == 200 and a.requests[-1]["model"] == "sql-lora"
    assert [r.status_code for r in unknown] == [404, 404]


async def test_the_model_list_with_a_trailing_slash_redirects_as_vllms() -> None:
    async with gateway([FakeReplica("a")]) as client:
        answer = await client.get("/v1/models/")
    assert answer.status_code == 307
    assert answer.headers["location"] == "http://gw/v1/models"


async def test_two_models_need_a_model_field() -> None:
    a, b = FakeReplica("a"), FakeReplica("b", model="other")
    no_model = {k: v for k, v in CHAT.items() if k != "model"}
    async with gateway([a, b]) as client:
        answer = await client.post("/v1/chat/completions", json=no_model)
    assert_openai_error(answer, 400)


async def test_ping_and_load_answer_as_vllms() -> None:
    """SageMaker's health check and vLLM's load route, which load balancers call."""
    a = FakeReplica("a")
    async with gateway([a], model="m") as client:
        up = [await client.get("/ping"), await client.post("/ping")]
        load = await client.get("/load")
        a.up = False
        await pool_of(client).probe(pool_of(client).get("a"))
        await pool_of(client).probe(pool_of(client).get("a"))
        down = await client.get("/ping")
    assert [r.status_code for r in up] == [200, 200] and up[0].content == b""
    assert load.json() == {"server_load": 0}
    assert down.status_code == 503


async def test_failover_before_first_byte_and_lease_released() -> None:
    a, b = FakeReplica("a"), FakeReplica("b")
    async with gateway([a, b], policy="round_robin") as client:
        a.up = False  # dies after the health check saw it healthy
        for _ in range(3):
            response = await client.post("/v1/chat/completions", json=CHAT)
            assert response.status_code == 200
            assert response.headers["x-prefixgate-replica"] == "b"
        pool = pool_of(client)
        assert not pool.get("a").healthy
        assert [r.inflight for r in pool] == [0, 0]
        metrics = (await client.get("/metrics")).text
    assert 'prefixgate_failovers_total{replica="a"} 1.0' in metrics


async def test_streaming_passthrough_and_usage() -> None:
    a = FakeReplica("a", chunks=4)
    async with gateway([a]) as client:
        async with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
            body = b"".join([c async for c in r.aiter_bytes()])
        assert r.headers["content-type"].startswith("text/event-stream")
        assert pool_of(client).get("a").inflight == 0
    events = [line for line in body.split(b"\n") if line.startswith(b"data: ")]
    assert events[-1] == b"data: [DONE]"
    assert [json.loads(e[6:])["choices"][0]["delta"]["content"] for e in events[:-1]] == [
        "t0", "t1", "t2", "t3"]


async def test_stream_broken_midway_ends_with_error_event() -> None:
    a = FakeReplica("a", chunks=5, break_stream_after=2)
    async with gateway([a]) as client:
        async with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
            body = b"".join([c async for c in r.aiter_bytes()])
        assert pool_of(client).get("a").inflight == 0
    last = [line for line in body.split(b"\n") if line.startswith(b"data: ")][-1]
    assert json.loads(last[6:])["error"]["code"] == "upstream_stream_broken"


async def test_least_load_prefers_idle_replica() -> None:
    busy, idle = FakeReplica("a", running=9), FakeReplica("b", running=0)
    async with gateway([busy, idle], policy="least_load") as client:
        served = {(await client.post("/v1/chat/completions", json=CHAT)).headers["x-prefixgate-replica"]
                  for _ in range(3)}
    assert served == {"b"}


async def test_models_lists_only_healthy_models() -> None:
    a, b = FakeReplica("a", model="m1"), FakeReplica("b", model="m2", up=False)
    async with gateway([a, b]) as client:
        data = (await client.get("/v1/models")).json()
    assert data["object"] == "list"
    assert [m["id"] for m in data["data"]] == ["m1"]


async def test_unknown_route_and_method_are_json() -> None:
    async with gateway([FakeReplica("a")]) as client:
        assert_openai_error(await client.get("/v1/nothing"), 404)
        assert_openai_error(await client.get("/v1/chat/completions"), 405)


async def test_a_gateway_fault_in_a_routed_request_is_a_json_500_and_the_next_one_is_served(
        caplog: pytest.LogCaptureFixture) -> None:
    a = FakeReplica("a")
    # Starlette re-raises to the server after answering (for its log), as
    # uvicorn expects; the test's in-process transport must not re-raise it.
    async with gateway([a], policy="round_robin", raise_app_exceptions=False) as client:
        decider = client.app.gateway.decider  # type: ignore[attr-defined]
        decide = decider.decide

        def broken(request):  # a bug in routing, not the client's fault
            raise RuntimeError("routing table corrupted")
        decider.decide = broken
        with caplog.at_level("ERROR", logger="prefixgate.errors"):
            error = assert_openai_error(await client.post("/v1/chat/completions", json=CHAT), 500)
        assert error["type"] == "InternalServerError"
        assert "routing table corrupted" in caplog.text  # logged with its traceback
        decider.decide = decide
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
    assert len(a.requests) == 1


async def test_with_no_replica_yet_a_request_is_told_to_retry_not_that_its_model_is_unknown(
) -> None:
    """A gateway whose replicas come from DNS that resolves to none yet (a rollout, a
    Service with no ready pod) has no model to name: a 503 the client retries, not a 404
    "does not exist. Valid aliases: ." that it does not."""
    async with gateway([]) as client:
        named = await client.post("/v1/chat/completions", json=CHAT)
        unnamed = await client.post("/v1/chat/completions",
                                    json={k: v for k, v in CHAT.items() if k != "model"})
    for response in (named, unnamed):
        assert_openai_error(response, 503)
        assert response.headers["retry-after"] == "1"
        assert "no replica yet" in response.json()["error"]["message"]


async def test_replicas_started_with_an_api_key_are_read_with_the_one_given(
        caplog: pytest.LogCaptureFixture) -> None:
    """vLLM started with ``--api-key`` answers 401 to the gateway's ``/v1/models``: without
    the key the gateway cannot read its models (their names, their tokenizers) and said
    nothing about why; with ``replica_api_key`` it reads them and sends the key."""
    guarded = FakeReplica("a", api_key="sekret")
    async with gateway([guarded]) as client:
        assert pool_of(client).model_root("m") is None
    assert "answers 401 to /v1/models: it takes an API key" in caplog.text
    guarded = FakeReplica("a", api_key="sekret")
    async with gateway([guarded], replica_api_key="sekret") as client:
        reply = await client.post("/v1/chat/completions", json=CHAT)
        assert pool_of(client).model_root("m") == "/models/m"
    assert reply.status_code == 200
    assert guarded.headers_seen[-1]["authorization"] == "Bearer sekret"
