"""The fuzz stage: requests generated from the gateway's own ``/openapi.json``.

Every route the document lists gets bodies that fit its schema, the same
bodies with hostile values swapped in at random depths (integers far
outside 64 bits, token ids outside [0, 2^32), nesting deeper than JSON
encoders go, template code, 50k-character strings), and byte strings that
are not a JSON object at all. What must hold for every one: no status of 500
or above, an answer within the per-case timeout (no hang), and every error
in OpenAI's shape ``{"error": {"message": str, "type": str, "param", "code"}}`` (on the
Anthropic Messages API's routes, or in its own: ``{"type": "error", "error": {type,
message}}``).

Two passes: ``PREFIXGATE_FUZZ_CASES`` cases (10,000 by default) in-process
(``httpx.ASGITransport``) against replicas that answer like vLLM to any JSON
(an ``httpx.MockTransport``), with the real Qwen3 tokenizer and chat template
rendering; then a smaller pass over real sockets against a gateway process
in front of two sim replicas.

Then heavy bodies (``n``, ``best_of``, ``max_tokens``, ``logprobs``,
``top_logprobs``, thousands of messages or tools: what can take a real
engine down) over real sockets against three sims told to hang on exactly
those (``--hang-on``, ``engine.sim.faults``): each must be answered within
the gateway's deadlines (a 502/504 for the replica that hung is honest, in
OpenAI's shape), and must not spread: the next ordinary request is served.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from asgi_lifespan import LifespanManager
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from engine.tokenizer import bundled_qwen_tokenizer_dir
from gateway.config import load_settings
from gateway.server.app import create_app
from tests.support.fuzz import (
    HANG_RULES,
    HOSTILE,
    ODD_BODIES,
    RAW_BODIES,
    from_schema,
    heavy,
    mutated,
)
from tests.support.gateway import GatewayProcess

from .conftest import MODEL, gateway_settings, running_sims, sim_args

CASES = int(os.environ.get("PREFIXGATE_FUZZ_CASES", "10000"))
SOCKET_CASES = max(CASES // 25, 50)
HEAVY_CASES = max(CASES // 500, 20)
"""Each heavy case costs the gateway a replica deadline (seconds), so there are fewer."""
CASE_TIMEOUT = 30.0
"""Seconds one case may take before it counts as a hang (a loaded 2-core CI box)."""

Body = tuple[str, str, bytes]
"""(method, path, body bytes)."""


class AnyJsonReplica:
    """Answers like a vLLM replica that accepts any JSON: 200 (SSE when ``stream`` is
    true), an OpenAI-shaped 400 for a body that is not JSON."""

    async def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/health":
            return httpx.Response(200)
        if path == "/metrics":
            return httpx.Response(200, text=f'vllm:num_requests_running{{model_name="{MODEL}"}} 0\n')
        if path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": MODEL}]})
        try:
            body = orjson.loads(request.content)
        except orjson.JSONDecodeError:
            return httpx.Response(400, json={"error": {"message": "bad JSON", "type":
                                                       "BadRequestError", "param": None,
                                                       "code": 400}})
        if isinstance(body, dict) and body.get("stream") is True:
            return httpx.Response(200, headers={"content-type": "text/event-stream"},
                                  content=b'data: {"choices": [{"index": 0, "delta": '
                                          b'{"content": "hi"}}]}\n\ndata: [DONE]\n\n')
        return httpx.Response(200, json={"id": "x", "object": "chat.completion",
                                         "choices": [{"index": 0, "finish_reason": "stop",
                                                      "message": {"role": "assistant",
                                                                  "content": "hi"}}]})


def check(response: httpx.Response, case: Body) -> None:
    where = f"{case[0]} {case[1]} {case[2][:200]!r}"
    assert response.status_code < 500, f"{response.status_code} for {where}: {response.text[:300]}"
    if response.status_code >= 400:
        body = response.json()
        error = body["error"]
        assert isinstance(error["message"], str) and isinstance(error["type"], str), where
        if case[1].startswith("/v1/messages") and body.get("type") == "error":
            return  # the Messages API's own shape (its errors but an unreadable body's)
        assert "param" in error and "code" in error, where


def encode(value: Any) -> bytes:
    import json  # the stdlib encoder: it goes deeper than orjson (255 levels)

    return json.dumps(value).encode()


class Cases:
    """The strategies for one OpenAPI document."""

    def __init__(self, document: dict[str, Any]) -> None:
        components = document["components"]["schemas"]
        self.posts: list[tuple[str, st.SearchStrategy[Any]]] = []
        self.gets: list[str] = []
        for path, operations in document["paths"].items():
            if "post" in operations:
                schema = operations["post"]["requestBody"]["content"]["application/json"]["schema"]
                self.posts.append((path, from_schema(schema, components)))
            if "get" in operations and path not in ("/metrics", "/dashboard"):
                self.gets.append(path)
        self.routed = [(p, s) for p, s in self.posts
                       if p in ("/v1/chat/completions", "/v1/completions")]

    def body(self, data: st.DataObject, routes: list[tuple[str, st.SearchStrategy[Any]]]) -> Body:
        path, fitting = data.draw(st.sampled_from(routes))
        shape = data.draw(st.sampled_from(["fits", "mutated", "mutated", "hostile", "raw"]))
        if shape == "raw":
            return "POST", path, data.draw(RAW_BODIES)
        if shape == "hostile":
            return "POST", path, encode(data.draw(HOSTILE))
        value = data.draw(fitting if shape == "fits" else mutated(fitting))
        if isinstance(value, dict) and data.draw(st.booleans()):
            value["model"] = MODEL  # most requests name the served model
        return "POST", path, encode(value)

    def get(self, data: st.DataObject) -> Body:
        path = data.draw(st.sampled_from(self.gets))
        filled = re.sub(r"\{[^}]+\}", lambda _: data.draw(st.sampled_from(
            [MODEL, "x", "%00", "..", "a" * 300, "resp_1"])), path)
        return "GET", filled, b""


class InProcess:
    """The gateway in-process, on one event loop kept for the whole module."""

    def __init__(self) -> None:
        replica = AnyJsonReplica()
        overrides = {"policy": "prefix", "health_interval": 3600.0,
                     "replicas": [{"id": f"r{i}", "url": f"http://r{i}", "model": MODEL}
                                  for i in range(2)],
                     "models": [{"name": MODEL, "tokenizer": bundled_qwen_tokenizer_dir()}],
                     "max_body_bytes": 1 << 20}
        self.app = create_app(load_settings(overrides=overrides, env={}),
                              transport=lambda _: httpx.MockTransport(replica.handle))
        self.loop = asyncio.new_event_loop()
        self.lifespan: LifespanManager | None = None
        self.client = self.loop.run_until_complete(self._start())
        self.cases = Cases(self.call("GET", "/openapi.json", b"").json())
        self.count = 0

    async def _start(self) -> httpx.AsyncClient:
        self.lifespan = LifespanManager(self.app, startup_timeout=120)
        await self.lifespan.__aenter__()
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.lifespan.app),
                                 base_url="http://gw")

    def call(self, method: str, path: str, body: bytes) -> httpx.Response:
        request = self.client.request(method, path, content=body,
                                      headers={"content-type": "application/json"})
        return self.loop.run_until_complete(asyncio.wait_for(request, CASE_TIMEOUT))

    def run(self, case: Body) -> None:
        self.count += 1
        check(self.call(*case), case)

    def close(self) -> None:
        self.loop.run_until_complete(self.client.aclose())
        if self.lifespan is not None:
            self.loop.run_until_complete(self.lifespan.__aexit__(None, None, None))
        self.loop.close()


@pytest.fixture(scope="module")
def in_process() -> Iterator[InProcess]:
    gateway = InProcess()
    try:
        yield gateway
    finally:
        gateway.close()


def fuzz(cases: int) -> settings:
    return settings(max_examples=cases, deadline=None, database=None, print_blob=True,
                    suppress_health_check=list(HealthCheck))


@fuzz(CASES * 6 // 10)
@given(data=st.data())
def test_routed_requests_never_fail(in_process: InProcess, data: st.DataObject) -> None:
    in_process.run(in_process.cases.body(data, in_process.cases.routed))


@fuzz(CASES * 4 // 10)
@given(data=st.data())
def test_every_route_never_fails(in_process: InProcess, data: st.DataObject) -> None:
    cases = in_process.cases
    case = cases.get(data) if data.draw(st.integers(0, 9)) == 0 else cases.body(data, cases.posts)
    in_process.run(case)


def odd_bodies() -> list[bytes]:
    """``ODD_BODIES``, and each that is a JSON object once more naming the served model
    (a replica reads what the gateway relays only when the model is one it serves)."""
    named = []
    for body in ODD_BODIES:
        with contextlib.suppress(ValueError, RecursionError):
            if isinstance(json.loads(body), dict):
                named.append(b'{"model": "' + MODEL.encode() + b'", ' + body.lstrip(b"{"))
    return ODD_BODIES + named


def test_every_route_answers_each_odd_body(in_process: InProcess) -> None:
    """Each once, not at random: CI's run drew a lone surrogate escape the local runs
    had not, and a 500 it had answered since the body reader took it."""
    for path, _ in in_process.cases.posts:
        for body in odd_bodies():
            in_process.run(("POST", path, body))


def test_the_stage_ran_every_case_and_the_gateway_still_answers(in_process: InProcess) -> None:
    assert in_process.count >= CASES
    health = in_process.call("GET", "/health", b"")
    assert health.status_code == 200
    chat = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert in_process.call("POST", "/v1/chat/completions", chat).status_code == 200


@pytest.fixture(scope="module")
def over_sockets() -> Iterator[tuple[httpx.Client, Cases]]:
    with running_sims([sim_args(i) for i in range(2)]) as sims:
        gateway = GatewayProcess(gateway_settings(sims, policy="prefix",
                                                  max_body_bytes=1 << 20)).start()
        try:
            with httpx.Client(base_url=gateway.url, timeout=CASE_TIMEOUT) as client:
                yield client, Cases(client.get("/openapi.json").json())
        finally:
            gateway.stop()


@fuzz(SOCKET_CASES)
@given(data=st.data())
def test_over_real_sockets_against_sims(over_sockets: tuple[httpx.Client, Cases],
                                        data: st.DataObject) -> None:
    client, cases = over_sockets
    case = cases.body(data, cases.routed)
    check(client.request(case[0], case[1], content=case[2],
                         headers={"content-type": "application/json"}), case)


def test_routed_odd_bodies_over_real_sockets_against_sims(
        over_sockets: tuple[httpx.Client, Cases]) -> None:
    client, cases = over_sockets
    for path, _ in cases.routed:
        for body in odd_bodies():
            check(client.post(path, content=body,
                              headers={"content-type": "application/json"}),
                  ("POST", path, body))


# --- heavy bodies against sims that hang on them ------------------------------------------

HEAVY_TIMEOUTS = {"first_byte": 2.0, "response": 4.0, "probe": 1.0}
"""Short deadlines, so a hung replica costs seconds per case, not the default minutes."""
UPSTREAM_ERRORS = {502, 504}
"""What the gateway may answer for a request a replica hung on: the replica's failure."""
BASES = {"/v1/chat/completions": {"model": MODEL, "max_tokens": 2,
                                  "messages": [{"role": "user", "content": "hi"}]},
         "/v1/completions": {"model": MODEL, "max_tokens": 2, "prompt": "hi"}}
ORDINARY = orjson.dumps(BASES["/v1/chat/completions"])


@pytest.fixture(scope="module")
def hanging_fleet() -> Iterator[tuple[httpx.Client, Cases]]:
    with running_sims([sim_args(i, "--hang-on", HANG_RULES) for i in range(3)]) as sims:
        gateway = GatewayProcess(gateway_settings(sims, policy="prefix", max_body_bytes=1 << 20,
                                                  timeouts=HEAVY_TIMEOUTS)).start()
        try:
            with httpx.Client(base_url=gateway.url, timeout=CASE_TIMEOUT) as client:
                yield client, Cases(client.get("/openapi.json").json())
        finally:
            gateway.stop()


@settings(parent=fuzz(HEAVY_CASES), phases=(Phase.explicit, Phase.generate))
@given(data=st.data())
def test_heavy_requests_against_sims_that_hang_on_them(
        hanging_fleet: tuple[httpx.Client, Cases], data: st.DataObject) -> None:
    client, cases = hanging_fleet
    path, fitting = data.draw(st.sampled_from(cases.routed))
    body = data.draw(heavy(fitting, BASES[path]))
    body["model"] = MODEL
    case = ("POST", path, encode(body))
    response = client.post(path, content=case[2], headers={"content-type": "application/json"})
    where = f"{path} {sorted(body)}"
    if response.status_code in UPSTREAM_ERRORS:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and "code" in error, where
    else:
        check(response, case)
    ordinary = client.post("/v1/chat/completions", content=ORDINARY,
                           headers={"content-type": "application/json"})
    assert ordinary.status_code == 200, (f"after {where} ({response.status_code}): the next "
                                         f"request got {ordinary.status_code} {ordinary.text}")


WEDGE_TIMEOUTS = {"first_byte": 10.0, "response": 10.0, "probe": 1.0}
"""Longer than the health probes take to see a wedged replica (about 2 s): the replica
leaves rotation while the request still waits on it, as in the issue."""


@pytest.mark.parametrize("stream", [False, True])
def test_a_query_of_death_that_wedges_its_replica_costs_that_replica_only(stream: bool) -> None:
    """The issue's own case: ``"n": 1000000000`` wedging the replica it reaches."""
    args = [sim_args(i, "--hang-on", HANG_RULES, "--hang-scope", "replica") for i in range(3)]
    with running_sims(args) as sims:
        gateway = GatewayProcess(gateway_settings(sims, timeouts=WEDGE_TIMEOUTS)).start()
        try:
            with httpx.Client(base_url=gateway.url, timeout=CASE_TIMEOUT) as client:
                death = client.post("/v1/chat/completions", json={
                    **BASES["/v1/chat/completions"], "n": 10**9, "stream": stream})
                assert death.status_code in UPSTREAM_ERRORS, death.text
                wedged = [sim for sim in sims if not _answers_health(sim.base_url)]
                assert len(wedged) == 1, f"{len(wedged)} replicas wedged by one request"
                ordinary = client.post("/v1/chat/completions", content=ORDINARY,
                                       headers={"content-type": "application/json"})
                assert ordinary.status_code == 200, ordinary.text
        finally:
            gateway.stop()


def _answers_health(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2.0).status_code == 200
    except httpx.TimeoutException:
        return False
