"""CORS as vLLM answers it (``--allowed-origins``): off by default, and when set, a
browser's preflight is answered and every answer, streamed ones included, names the
origin allowed."""

from __future__ import annotations

from .fake_replica import FakeReplica
from .test_gateway_core import CHAT, gateway

ORIGIN = {"origin": "http://localhost:3000"}
PREFLIGHT = {**ORIGIN, "access-control-request-method": "POST",
             "access-control-request-headers": "authorization,content-type"}


async def test_browsers_get_cors_headers_when_origins_are_allowed() -> None:
    async with gateway([FakeReplica("a", chunks=3)], allowed_origins=["*"]) as client:
        preflight = await client.options("/v1/chat/completions", headers=PREFLIGHT)
        plain = await client.post("/v1/chat/completions", json=CHAT, headers=ORIGIN)
        async with client.stream("POST", "/v1/chat/completions", headers=ORIGIN,
                                 json={**CHAT, "stream": True}) as streamed:
            body = b"".join([chunk async for chunk in streamed.aiter_bytes()])
        models = await client.get("/v1/models", headers=ORIGIN)
        unknown = await client.post("/v1/chat/completions", headers=ORIGIN,
                                    json={**CHAT, "model": "nope"})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "*"
    assert "POST" in preflight.headers["access-control-allow-methods"]
    for answer in (plain, streamed, models, unknown):
        assert answer.headers["access-control-allow-origin"] == "*"
    assert plain.status_code == 200 and body.endswith(b"data: [DONE]\n\n")
    assert unknown.status_code == 404


async def test_only_the_origins_allowed() -> None:
    allowed = ["https://app.example.com"]
    async with gateway([FakeReplica("a")], allowed_origins=allowed,
                       allow_credentials=True) as client:
        good = await client.post("/v1/chat/completions", json=CHAT,
                                 headers={"origin": allowed[0]})
        bad = await client.options("/v1/chat/completions", headers=PREFLIGHT)
    assert good.headers["access-control-allow-origin"] == allowed[0]
    assert good.headers["access-control-allow-credentials"] == "true"
    assert bad.status_code == 400  # a disallowed origin's preflight, as vLLM refuses it


async def test_no_cross_origin_access_by_default() -> None:
    async with gateway([FakeReplica("a")]) as client:
        plain = await client.post("/v1/chat/completions", json=CHAT, headers=ORIGIN)
        preflight = await client.options("/v1/chat/completions", headers=PREFLIGHT)
    assert plain.status_code == 200 and "access-control-allow-origin" not in plain.headers
    assert preflight.status_code == 405
