"""The linter's HTTP face, in front of fake replicas (ASGI, no sockets)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager

from gateway.config import load_settings
from gateway.server.app import create_app
from tests.support.api_keys import write_keys
from tests.support.waiting import eventually_async

from ..fake_replica import FakeReplica

SYSTEM = ("You are the assistant of Acme Travel. Be brief and friendly. " * 4
          + "Current time: 2026-11-30 15:25:07 UTC.")
CHAT = {"model": "m", "messages": [{"role": "system", "content": SYSTEM},
                                   {"role": "user", "content": "Any flights to Oslo?"}]}


@asynccontextmanager
async def gateway(qwen_dir: str, **settings: Any) -> AsyncIterator[httpx.AsyncClient]:
    replica = FakeReplica("a")
    overrides = {"replicas": [{"id": "a", "url": "http://a", "model": "m"}],
                 "models": [{"name": "m", "tokenizer": qwen_dir}],
                 "health_interval": 3600.0, **settings}
    app = create_app(load_settings(overrides=overrides, env={}),
                     transport=lambda rid: replica.transport())
    # Start-up loads the tokenizer: slow on a busy machine, so more than the default 5 s.
    async with LifespanManager(app, startup_timeout=60) as manager, httpx.AsyncClient(
            transport=httpx.ASGITransport(app=manager.app), base_url="http://gw") as client:
        yield client


async def warm_up(client: httpx.AsyncClient) -> None:
    await warm_up_with(client, {})


async def warm_up_with(client: httpx.AsyncClient, headers: dict[str, str]) -> None:
    """One request of another app, linted: the name lists are loaded (the first English
    text's lint runs in a worker thread while they load), so the next requests are linted
    on the event loop, one after the other, in the order they were sent."""
    tool = {"type": "function", "function": {"name": "warm", "parameters": {}}}
    await client.post("/v1/chat/completions", headers=headers, json={**CHAT, "tools": [tool]})

    async def linted() -> bool:
        return 'prefixgate_lint_findings_total{kind="timestamp"} 1.0' in (
            await client.get("/metrics", headers=headers)).text
    await eventually_async(linted, what="the warm-up request linted")


async def test_routed_chat_carries_the_lint_header(qwen_dir: str) -> None:
    """The linter never holds an answer back: a prefix's first request goes out before
    it is linted (no header); once linted, its next requests carry the count."""
    clean_chat = {**CHAT, "messages": [{"role": "system", "content": "Be brief."},
                                       {"role": "user", "content": "hi"}]}
    async with gateway(qwen_dir) as client:
        first = await client.post("/v1/chat/completions", json=CHAT)
        await client.post("/v1/chat/completions", json=clean_chat)

        async def linted() -> bool:
            return 'prefixgate_lint_findings_total{kind="timestamp"} 1.0' in (
                await client.get("/metrics")).text
        await eventually_async(linted, what="the first requests linted")
        stamped = await client.post("/v1/chat/completions", json={
            **CHAT, "messages": [CHAT["messages"][0], {"role": "user", "content": "And Rome?"}]})
        clean = await client.post("/v1/chat/completions", json=clean_chat)

        async def clean_linted() -> bool:  # its lint may finish after the stamped one's
            nonlocal clean
            clean = await client.post("/v1/chat/completions", json=clean_chat)
            return "x-prefixgate-lint" in clean.headers
        await eventually_async(clean_linted, what="the clean prompt linted")
        ops = (await client.get("/admin/replicas")).json()
    assert first.status_code == 200 and "x-prefixgate-lint" not in first.headers
    assert stamped.headers["x-prefixgate-lint"] == "1"
    assert clean.headers["x-prefixgate-lint"] == "0"
    assert ops["lint_findings"][0]["kind"] == "timestamp"


async def test_lint_endpoint_single_and_batch(qwen_dir: str) -> None:
    async with gateway(qwen_dir) as client:
        single = await client.post("/v1/prompt/lint", json={"messages": CHAT["messages"]})
        batch = await client.post("/v1/prompt/lint", json={"requests": [
            {"messages": [{"role": "system", "content": f"Hello {name}, you are a {tier} member."
                                                        " Keep answers short and precise."},
                          {"role": "user", "content": "hi"}]}
            for name, tier in (("Alice", "gold"), ("Bruno", "silver"), ("Chen", "gold"))]})
    assert single.status_code == 200
    report = single.json()
    assert report["object"] == "prompt.lint" and report["model"] == "m"
    [finding] = report["findings"]
    assert finding["kind"] == "timestamp" and finding["path"] == "messages[0].content"
    assert report["cacheable_prefix_tokens"] < report["cacheable_prefix_tokens_if_fixed"]
    assert batch.status_code == 200
    [group] = batch.json()["groups"]
    assert [v["text"] for v in group["varying"]] == ["Alice", "gold"]


async def test_lint_endpoint_lints_a_messages_api_system_prompt(qwen_dir: str) -> None:
    """An Anthropic Messages API body: its top-level system is the system prompt."""
    body = {"model": "m", "max_tokens": 64, "system": [{"type": "text", "text": SYSTEM}],
            "messages": [{"role": "user", "content": "Any flights to Oslo?"}]}
    async with gateway(qwen_dir) as client:
        single = await client.post("/v1/prompt/lint", json=body)
        batch = await client.post("/v1/prompt/lint", json={"requests": [body, CHAT]})
    assert single.status_code == 200 and batch.status_code == 200
    [finding] = single.json()["findings"]
    assert (finding["kind"], finding["severity"], finding["path"]) == (
        "timestamp", "warning", "system[0].text")
    assert SYSTEM[finding["start"]:finding["end"]] == finding["text"]
    assert [[f["path"] for f in r["findings"]] for r in batch.json()["requests"]] == [
        ["system[0].text"], ["messages[0].content"]]


async def test_lint_endpoint_lints_the_text_beside_an_image(qwen_dir: str) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    chat = {**CHAT, "messages": [CHAT["messages"][0], {"role": "user", "content": [
        {"type": "text", "text": "Any flights to Oslo?"}, image]}]}
    async with gateway(qwen_dir) as client:
        answer = await client.post("/v1/prompt/lint", json=chat)
    assert answer.status_code == 200  # not "cannot be rendered"
    assert [(f["kind"], f["severity"], f["path"]) for f in answer.json()["findings"]] == [
        ("timestamp", "warning", "messages[0].content"),
        ("media", "info", "messages[1].content[1]")]


async def test_lint_endpoint_errors(qwen_dir: str) -> None:
    async with gateway(qwen_dir, max_body_bytes=2000) as client:
        big = await client.post("/v1/prompt/lint", json={
            "messages": [{"role": "user", "content": "x" * 5000}]})
        bad_json = await client.post("/v1/prompt/lint", content=b"{nope")
        unknown = await client.post("/v1/prompt/lint", json={**CHAT, "model": "nope"})
        bad_item = await client.post("/v1/prompt/lint", json={"requests": [
            {"messages": [{"role": "user", "content": "ok"}]}, {"messages": []}]})
        empty = await client.post("/v1/prompt/lint", json={"requests": []})
    assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"
    assert bad_json.status_code == 400
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"
    assert bad_item.status_code == 400
    assert bad_item.json()["error"]["param"] == "requests[1].messages"
    assert empty.status_code == 400


async def test_deeply_nested_tools_are_a_400(qwen_dir: str) -> None:
    deep = '{"items": ' * 1000 + '"leaf"' + "}" * 1000  # deeper than json.dumps can write
    tools = '[{"type": "function", "function": {"name": "f", "parameters": ' + deep + "}}]"
    chat = json.dumps(CHAT)[:-1] + ', "tools": ' + tools + "}"
    async with gateway(qwen_dir) as client:
        answer = await client.post("/v1/prompt/lint", content=chat)
        batch = await client.post("/v1/prompt/lint", content='{"requests": [' + chat + "]}")
        fine = await client.post("/v1/prompt/lint", json={**CHAT, "tools": [
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "tools"
    assert "nested deeper than" in answer.json()["error"]["message"]
    assert batch.status_code == 400 and fine.status_code == 200


async def test_admin_drift_reports_a_template_change(qwen_dir: str) -> None:
    policy = "You are the assistant of Acme Travel. Refunds within 24 hours. " * 6
    async with gateway(qwen_dir) as client:
        await warm_up(client)
        for i in range(14):
            await client.post("/v1/chat/completions", json={
                **CHAT, "messages": [{"role": "system", "content": policy},
                                     {"role": "user", "content": f"q{i}"}]})
        for i in range(6):
            await client.post("/v1/chat/completions", json={
                **CHAT, "messages": [{"role": "system",
                                      "content": f"Request {i:04d}-{i * 37:05d}. " + policy},
                                     {"role": "user", "content": "q"}]})

        async def drifted() -> bool:  # the linter looks at a request once it has left
            seen = (await client.get("/admin/drift")).json()
            return bool(seen["events"]) and seen["groups"][0]["requests"] == 20
        await eventually_async(drifted, what="the drift reported")
        drift = (await client.get("/admin/drift")).json()
        ops = (await client.get("/admin/replicas")).json()
        metrics = (await client.get("/metrics")).text
    [event] = drift["events"]
    assert event["path"] == "messages[0].content" and event["offset"] == 0
    assert event["before"]["chars"] == 0 and event["now"]["chars"] == len("Request 0005-00185.")
    assert "Request" not in str(drift) and "Acme" not in str(drift)  # no prompt text
    assert drift["groups"][0]["requests"] == 20
    assert ops["drift_events"][0]["kind"] == "system_prompt"
    assert "Request" not in str(ops["drift_events"])  # no prompt text on the dashboard
    assert 'prefixgate_prefix_drift_events_total{model="m"} 1.0' in metrics


async def drift_through(client: httpx.AsyncClient, headers: dict[str, str]) -> None:
    policy = "You are the assistant of Acme Travel. Refunds within 24 hours. " * 6
    for i in range(14):
        await client.post("/v1/chat/completions", headers=headers, json={
            **CHAT, "messages": [{"role": "system", "content": policy},
                                 {"role": "user", "content": f"q{i}"}]})
    for i in range(6):
        await client.post("/v1/chat/completions", headers=headers, json={
            **CHAT, "messages": [{"role": "system",
                                  "content": f"Request {i:04d}-{i * 37:05d}. " + policy},
                                 {"role": "user", "content": "q"}]})

    async def drifted() -> bool:
        return bool((await client.get("/admin/drift", headers=headers)).json()["events"])
    await eventually_async(drifted, what="the drift reported")


async def test_text_samples_are_for_admin_keys_only(qwen_dir: str, tmp_path: Path) -> None:
    keys = write_keys(tmp_path / "keys.yaml", [
        {"key": "sk-admin-0001", "tenant": "ops", "admin": True},
        {"key": "sk-app-00002", "tenant": "app"}])
    admin, app = ({"authorization": f"Bearer {k}"} for k in ("sk-admin-0001", "sk-app-00002"))
    async with gateway(qwen_dir, api_keys=keys, lint={"text_samples": True}) as client:
        await warm_up_with(client, admin)
        await drift_through(client, admin)
        shown = (await client.get("/admin/drift", headers=admin)).json()
        refused = await client.get("/admin/drift", headers=app)
    assert shown["text_samples"] is True
    assert shown["events"][0]["now"]["text"].startswith("Request 00")
    assert refused.status_code == 403
    async with gateway(qwen_dir, lint={"text_samples": True}) as client:  # no keys: no admin
        await warm_up(client)
        await drift_through(client, {})
        hidden = (await client.get("/admin/drift")).json()
    assert hidden["text_samples"] is False and "Request" not in str(hidden)


async def test_live_lint_can_be_switched_off(qwen_dir: str) -> None:
    async with gateway(qwen_dir, lint={"enabled": False}) as client:
        routed = await client.post("/v1/chat/completions", json=CHAT)
        metrics = (await client.get("/metrics")).text
        linted = await client.post("/v1/prompt/lint", json=CHAT)
    assert routed.status_code == 200 and "x-prefixgate-lint" not in routed.headers
    assert 'prefixgate_lint_findings_total{kind="timestamp"}' not in metrics
    assert linted.json()["warnings"] == 1  # the endpoint still lints on request


async def test_live_learning_can_be_switched_off(qwen_dir: str) -> None:
    """Four agents' names in one system prompt: with learning on, the group would learn
    the name as a varying span (see test_service); off, no group is kept at all."""
    varying = [{**CHAT, "messages": [{"role": "system", "content": f"Agent {name}. " + SYSTEM},
                                     CHAT["messages"][1]]} for name in ("Ann", "Bo", "Cy", "Di")]
    async with gateway(qwen_dir, lint={"learn": False}) as client:
        for body in varying * 2:
            assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
        drift = (await client.get("/admin/drift")).json()
    assert drift["groups"] == [] and drift["events"] == []  # nothing learned


@pytest.mark.parametrize("worker", ["thread", "process"])
async def test_responses_api_instructions_are_linted_as_a_system_prompt(
        qwen_dir: str, worker: str) -> None:
    """An agent on the Responses API: its instructions are its system prompt, and a clock
    in them breaks the cache as in a chat request's (the linter in a thread or in a
    process of its own)."""
    turn = {"model": "m", "instructions": SYSTEM,
            "input": [{"role": "user", "content": "Find me a flight to Lisbon."},
                      {"type": "function_call", "call_id": "c1", "name": "search",
                       "arguments": "{}"}]}
    async with gateway(qwen_dir, lint={"worker": worker}) as client:
        first = await client.post("/v1/responses", json=turn)

        async def linted() -> bool:
            return 'prefixgate_lint_findings_total{kind="timestamp"} 1.0' in (
                await client.get("/metrics")).text
        await eventually_async(linted, what="the agent's first turn linted")
        second = await client.post("/v1/responses", json={**turn, "input": turn["input"][:1]})
    assert first.status_code == 200 and second.status_code == 200
    assert second.headers["x-prefixgate-lint"] == "1"


async def test_a_batch_of_chats_is_linted_by_its_first_conversation(qwen_dir: str) -> None:
    """vLLM 0.32's batch of chats: a clock in the first conversation's system prompt is
    found and named in the batch's answer header, as on a chat request (routing reads the
    same conversation)."""
    batch = {"model": "m", "max_tokens": 4, "messages": [CHAT["messages"], CHAT["messages"]]}
    async with gateway(qwen_dir) as client:
        await client.post("/v1/chat/completions/batch", json=batch)

        async def linted() -> bool:
            return 'prefixgate_lint_findings_total{kind="timestamp"} 1.0' in (
                await client.get("/metrics")).text
        await eventually_async(linted, what="the batch's first conversation linted")
        again = await client.post("/v1/chat/completions/batch", json=batch)
    assert again.status_code == 200 and again.headers["x-prefixgate-lint"] == "1"


async def test_a_lone_surrogate_is_a_400_that_says_so(qwen_dir: str,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """``"\\ud800"`` escaped in a body is JSON the gateway reads (as vLLM does) and no
    tokenizer takes: the lint endpoint answered 500; a routed request is the replica's
    to answer, without a warning per request that routing failed."""
    bad = b'{"model": "m", "messages": [{"role": "user", "content": "hi \\ud800"}]}'
    batch = b'{"model": "m", "requests": [{"messages": [{"role": "user", "content": "ok"}]}, ' \
            b'{"messages": [{"role": "system", "content": "\\udfff"}]}]}'
    headers = {"content-type": "application/json"}
    async with gateway(qwen_dir) as client:
        for body in (bad, batch):
            answer = await client.post("/v1/prompt/lint", content=body, headers=headers)
            assert answer.status_code == 400
            error = answer.json()["error"]
            assert "lone UTF-16 surrogate" in error["message"] and error["param"] == "messages"
        routed = await client.post("/v1/chat/completions", content=bad, headers=headers)
        assert routed.status_code == 200  # the fake replica's answer, forwarded
    assert "could not analyse" not in caplog.text
