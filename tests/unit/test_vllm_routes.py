"""vLLM's other routes through the gateway, against fake replicas (httpx.MockTransport):
what reaches the replica (path, method, headers, bytes), how each route is routed,
and that the edge is no stricter than vLLM."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import httpx
import pytest
from asgi_lifespan import LifespanManager

from gateway.config import load_settings
from gateway.request.usage import StreamObserver, Usage, usage_from_json
from gateway.server.app import create_app


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Replica:
    """A replica that records every request and answers like vLLM would, roughly."""

    name: str
    models: tuple[str, ...] = ("m",)
    running: int = 0
    seen: list[Seen] = field(default_factory=list)
    stored: set[str] = field(default_factory=set)
    counter: int = 0

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def routed(self) -> list[Seen]:
        return [s for s in self.seen if s.path not in ("/health", "/metrics", "/v1/models")]

    async def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        self.seen.append(Seen(request.method, str(request.url.raw_path.decode()),
                              dict(request.headers), request.content))
        if path == "/health":
            return httpx.Response(200)
        if path == "/metrics":
            return httpx.Response(200, text=(
                f'vllm:num_requests_running{{engine="0",model_name="{self.models[0]}"}} '
                f'{self.running}.0\n'))
        if path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [
                {"id": m, "object": "model", "owned_by": "vllm", "root": f"/models/{m}",
                 "max_model_len": 4096, "permission": [{"id": "modelperm-1"}]}
                for m in self.models]})
        if path == "/version":
            return httpx.Response(200, json={"version": f"0.32.0-{self.name}"})
        if path == "/v1/responses" and request.method == "POST":
            self.counter += 1
            response_id = f"resp_{self.name}{self.counter}"
            self.stored.add(response_id)
            if json.loads(request.content).get("stream"):
                event = {"response": {"id": response_id, "object": "response"},
                         "sequence_number": 0, "type": "response.created"}
                body = (b"event: response.created\ndata: " + json.dumps(event).encode()
                        + b"\n\n")
                return httpx.Response(200, headers={"content-type": "text/event-stream"},
                                      content=body)
            return httpx.Response(200, json={"id": response_id, "object": "response"})
        if path.startswith("/v1/responses/"):
            response_id = path.split("/")[3]
            if response_id not in self.stored:
                return httpx.Response(404, json={"error": {
                    "message": f"Response with id '{response_id}' not found.",
                    "type": "invalid_request_error", "param": "response_id", "code": 404}})
            return httpx.Response(200, json={"id": response_id, "object": "response"})
        return httpx.Response(200, json={"object": "list", "data": [], "from": self.name})


@asynccontextmanager
async def gateway(replicas: list[Replica], replica_key: str | None = None,
                  **settings: object) -> AsyncIterator[httpx.AsyncClient]:
    overrides = {"replicas": [{"id": r.name, "url": f"http://{r.name}", "api_key": replica_key}
                              for r in replicas],
                 "health_interval": 3600.0, "policy": "prefix", **settings}
    by_id = {r.name: r for r in replicas}
    app = create_app(load_settings(overrides=overrides, env={}),
                     transport=lambda rid: by_id[rid].transport())
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            client.app = app  # type: ignore[attr-defined]
            yield client


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


async def test_headers_reach_the_replica_except_hop_by_hop_and_host() -> None:
    replica = Replica("a")
    async with gateway([replica]) as client:
        response = await client.post("/v1/embeddings", json={"input": "hi"}, headers={
            "user-agent": "my-app/1.2", "x-custom": "yes", "authorization": "Bearer client",
            "connection": "keep-alive, x-hop", "x-hop": "drop me", "keep-alive": "timeout=5",
            "proxy-authorization": "Basic c2VjcmV0", "te": "trailers", "x-request-id": "r1"})
    assert response.status_code == 200
    seen = replica.routed()[-1]
    assert seen.headers["user-agent"] == "my-app/1.2"
    assert seen.headers["x-custom"] == "yes"
    assert seen.headers["authorization"] == "Bearer client"
    assert seen.headers["x-request-id"] == "r1"
    for dropped in ("x-hop", "keep-alive", "proxy-authorization", "te"):
        assert dropped not in seen.headers
    assert seen.headers["host"] == "a"


async def test_a_replica_api_key_replaces_the_clients_authorization() -> None:
    replica = Replica("a")
    async with gateway([replica], replica_key="replica-key") as client:
        await client.post("/tokenize", json={"prompt": "hi"},
                          headers={"authorization": "Bearer client"})
    assert replica.routed()[-1].headers["authorization"] == "Bearer replica-key"


async def test_each_route_reaches_the_replica_at_its_own_path_with_the_model_filled_in() -> None:
    replica = Replica("a")
    paths = ["/tokenize", "/detokenize", "/v1/embeddings", "/pooling", "/classify", "/score",
             "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank", "/v1/chat/completions/render"]
    async with gateway([replica]) as client:
        for path in paths:
            response = await client.post(path, json={"input": "x", "messages": [
                {"role": "user", "content": "x"}]})
            assert response.status_code == 200, path
            assert response.headers["x-prefixgate-replica"] == "a"
    routed = replica.routed()
    assert [s.path for s in routed] == paths
    assert all(json.loads(s.body)["model"] == "m" for s in routed)


async def test_multipart_audio_goes_through_byte_for_byte() -> None:
    replica = Replica("a")
    files = {"file": ("a.wav", b"RIFF" + bytes(range(256)) * 40, "audio/wav")}
    request = httpx.Request("POST", "http://gw/v1/audio/transcriptions", files=files,
                            data={"model": "m", "language": "en"})
    body = request.read()
    async with gateway([replica]) as client:
        response = await client.post("/v1/audio/transcriptions", content=body,
                                     headers={"content-type": request.headers["content-type"]})
    assert response.status_code == 200
    seen = replica.routed()[-1]
    assert seen.body == body
    assert seen.headers["content-type"] == request.headers["content-type"]


async def test_a_form_for_an_unknown_model_is_refused_at_the_edge() -> None:
    request = httpx.Request("POST", "http://gw/x", files={"file": ("a.wav", b"x")},
                            data={"model": "nope"})
    async with gateway([Replica("a")]) as client:
        response = await client.post("/v1/audio/translations", content=request.read(),
                                     headers={"content-type": request.headers["content-type"]})
    assert error_of(response, 404)["param"] == "model"


@pytest.mark.parametrize("body", [
    {"model": "m", "messages": [{"role": "ipython", "content": "{\"ok\": 1}"}]},
    {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 200},
    {"model": "m", "messages": [{"role": "user", "content": 5}]},
    {"model": "m", "messages": "not a list", "temperature": "hot"},
])
async def test_chat_bodies_vllm_may_accept_reach_the_replica(body: dict) -> None:
    replica = Replica("a")
    async with gateway([replica]) as client:
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    assert json.loads(replica.routed()[-1].body) == body


@pytest.mark.parametrize("body", [
    {"model": "m", "prompt": "hi", "max_tokens": 0, "echo": True},
    {"model": "m", "prompt_embeds": "AAAA"},
    {"model": "m", "prompt": [[]]},
])
async def test_completion_bodies_vllm_may_accept_reach_the_replica(body: dict) -> None:
    replica = Replica("a")
    async with gateway([replica]) as client:
        response = await client.post("/v1/completions", json=body)
    assert response.status_code == 200
    assert json.loads(replica.routed()[-1].body) == body


@pytest.mark.parametrize(("raw", "param"), [
    (b"{not json", None), (b"[1, 2]", None), (b'{"model": 7, "input": "x"}', "model")])
async def test_what_routing_cannot_read_is_a_400(raw: bytes, param: str | None) -> None:
    replica = Replica("a")
    async with gateway([replica]) as client:
        response = await client.post("/v1/embeddings", content=raw,
                                     headers={"content-type": "application/json"})
    assert error_of(response, 400)["param"] == param
    assert replica.routed() == []


async def test_no_model_while_several_are_served_is_a_400() -> None:
    async with gateway([Replica("a", models=("m1",)), Replica("b", models=("m2",))]) as client:
        response = await client.post("/tokenize", json={"prompt": "hi"})
        named = await client.post("/tokenize", json={"prompt": "hi", "model": "m2"})
    assert error_of(response, 400)["param"] == "model"
    assert named.headers["x-prefixgate-replica"] == "b"


async def test_load_routes_go_to_the_least_loaded_replica() -> None:
    busy, idle = Replica("busy", running=9), Replica("idle")
    async with gateway([busy, idle]) as client:
        answered = {(await client.post(p, json={"input": "x"})).headers["x-prefixgate-replica"]
                    for p in ("/v1/embeddings", "/rerank", "/classify", "/tokenize")}
    assert answered == {"idle"}


@pytest.mark.parametrize("stream", [False, True])
async def test_stored_responses_are_followed_to_the_replica_that_holds_them(stream: bool) -> None:
    a, b = Replica("a"), Replica("b")
    async with gateway([a, b], policy="round_robin") as client:
        first = await client.post("/v1/responses", json={"input": "hi", "stream": stream})
        home = first.headers["x-prefixgate-replica"]
        response_id = (f"resp_{home}1")
        follow_ups = [await client.post("/v1/responses", json={
            "input": "and?", "previous_response_id": response_id}) for _ in range(3)]
        got = await client.get(f"/v1/responses/{response_id}")
        cancelled = await client.post(f"/v1/responses/{response_id}/cancel")
    assert {r.headers["x-prefixgate-replica"] for r in follow_ups} == {home}
    assert got.status_code == cancelled.status_code == 200
    assert got.headers["x-prefixgate-replica"] == cancelled.headers["x-prefixgate-replica"] == home
    other = b if home == "a" else a
    assert all(s.path == "/v1/responses" and b"previous_response_id" not in s.body
               for s in other.routed())


async def test_a_response_id_the_gateway_never_saw_is_found_on_its_replica() -> None:
    a, b = Replica("a"), Replica("b")
    b.stored.add("resp_elsewhere")
    async with gateway([a, b]) as client:
        got = await client.get("/v1/responses/resp_elsewhere?stream=false")
        missing = await client.get("/v1/responses/resp_nowhere")
    assert got.status_code == 200
    assert got.headers["x-prefixgate-replica"] == "b"
    assert "/v1/responses/resp_elsewhere?stream=false" in [s.path for s in b.routed()]
    assert error_of(missing, 404)["param"] == "response_id"  # the replica's own 404


async def test_models_are_the_replicas_own_entries_merged() -> None:
    async with gateway([Replica("a", models=("m1", "m2")), Replica("b", models=("m2",))]) as c:
        listed = (await c.get("/v1/models")).json()["data"]
        one = await c.get("/v1/models/m2")
        missing = await c.get("/v1/models/nope")
    assert [m["id"] for m in listed] == ["m1", "m2"]
    assert listed[0] == {"id": "m1", "object": "model", "owned_by": "vllm", "root": "/models/m1",
                         "max_model_len": 4096, "permission": [{"id": "modelperm-1"}]}
    assert one.json()["id"] == "m2" and one.json()["max_model_len"] == 4096
    assert error_of(missing, 404)["param"] == "model"


async def test_version_names_the_gateway_and_every_replica() -> None:
    async with gateway([Replica("a"), Replica("b")]) as client:
        answer = (await client.get("/version")).json()
    assert answer["version"] == "0.32.0-a"
    assert answer["replicas"] == {"a": "0.32.0-a", "b": "0.32.0-b"}
    assert answer["prefixgate"]


async def test_an_unknown_path_is_an_openai_shaped_404() -> None:
    replica = Replica("a")
    async with gateway([replica]) as client:
        response = await client.post("/v1/nothing-here", json={})
    error_of(response, 404)
    assert replica.routed() == []


async def test_the_path_goes_on_as_the_client_escaped_it() -> None:
    replica = Replica("a")
    replica.stored.add("resp 1")
    async with gateway([replica]) as client:
        response = await client.get("/v1/responses/resp%201?starting_after=2")
    assert response.status_code == 200
    assert replica.routed()[-1].path == "/v1/responses/resp%201?starting_after=2"


RESPONSES_USAGE = {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10,
                   "input_tokens_details": {"cached_tokens": 2},
                   "output_tokens_details": {"reasoning_tokens": 0}}


def test_a_responses_answers_usage_is_read_plain_and_streamed() -> None:
    expected = Usage(prompt_tokens=7, completion_tokens=3, cached_tokens=2)
    assert usage_from_json(json.dumps({"id": "resp_1", "usage": RESPONSES_USAGE}).encode()) \
        == expected
    observer = StreamObserver()
    for event in ({"response": {"id": "resp_1", "usage": None}, "type": "response.created"},
                  {"delta": "hi", "type": "response.output_text.delta"},
                  {"response": {"id": "resp_1", "usage": RESPONSES_USAGE},
                   "type": "response.completed"}):
        observer.feed(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
    assert observer.usage() == expected


ANTHROPIC_USAGE = {"input_tokens": 9, "output_tokens": 16, "cache_read_input_tokens": 160,
                   "cache_creation_input_tokens": 32}
"""What vLLM's /v1/messages answered for a prompt of 201 tokens, 160 of them cached."""


def test_an_anthropic_answers_usage_is_its_three_parts_of_the_prompt() -> None:
    expected = Usage(prompt_tokens=201, completion_tokens=16, cached_tokens=160)
    assert usage_from_json(json.dumps({"type": "message", "usage": ANTHROPIC_USAGE}).encode()) \
        == expected
    observer = StreamObserver()
    for event in ({"type": "message_start", "message": {"usage": {
                       "input_tokens": 9, "output_tokens": 0}}},
                  {"type": "content_block_delta", "index": 0,
                   "delta": {"type": "text_delta", "text": "hi"}},
                  {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                   "usage": ANTHROPIC_USAGE},
                  {"type": "message_stop"}):
        observer.feed(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
    assert observer.usage() == expected


@pytest.mark.parametrize("end", ["\n", "\r\n", "\r"])
@pytest.mark.parametrize("field", ["data: ", "data:"])
def test_a_streams_usage_is_read_whatever_line_ends_and_field_form_it_uses(
        end: str, field: str) -> None:
    """SSE allows three line ends and no space after the field's colon; a server in
    front of vLLM may re-frame its stream so."""
    observer = StreamObserver()
    usage = {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14,
             "prompt_tokens_details": {"cached_tokens": 8}}
    for event in ({"choices": [{"delta": {"content": "hi"}}]},
                  {"choices": [{"delta": {"content": "!"}}]},
                  {"choices": [], "usage": usage}):
        observer.feed(f"{field}{json.dumps(event)}{end}{end}".encode())
    observer.feed(f"{field}[DONE]{end}{end}".encode())
    assert observer.usage() == Usage(prompt_tokens=12, completion_tokens=2, cached_tokens=8)


async def test_a_stored_response_whose_replica_is_out_of_rotation_is_a_503() -> None:
    a, b = Replica("a"), Replica("b")
    async with gateway([a, b], policy="round_robin") as client:
        first = await client.post("/v1/responses", json={"input": "hi"})
        home = first.headers["x-prefixgate-replica"]
        client.app.gateway.pool.report_failure(home, "went away")  # type: ignore
        follow = await client.post("/v1/responses", json={
            "input": "and?", "previous_response_id": first.json()["id"]})
    assert error_of(follow, 503)["message"].startswith(f"replica {home}, which holds")
    assert follow.headers["retry-after"]
