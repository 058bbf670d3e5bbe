"""Where a served model's tokenizer comes from when nobody configured one, and how loudly."""

from __future__ import annotations

import logging
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager
from huggingface_hub import constants

from gateway.config import load_settings
from gateway.prompt.hashers import HasherSet, TokenizerConfigError
from gateway.prompt.tokenizer_source import find_tokenizer
from gateway.server.app import create_app


@pytest.fixture()
def hf_cache(tmp_path: Path, qwen_dir: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A local Hugging Face cache holding ``acme/tiny-chat`` (the Qwen tokenizer files)."""
    repo = tmp_path / "hub" / "models--acme--tiny-chat"
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    for item in Path(qwen_dir).iterdir():
        shutil.copy(item, snapshot / item.name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    return snapshot


def test_discovery_order(qwen_dir: str, hf_cache: Path, tmp_path: Path) -> None:
    assert find_tokenizer("m", "/configured", qwen_dir).source == "config"
    root = find_tokenizer("m", None, qwen_dir)
    assert (root.source, root.path) == ("replica-root", qwen_dir)
    by_root = find_tokenizer("served-name", None, "acme/tiny-chat")
    assert (by_root.source, by_root.path) == ("hf-cache", str(hf_cache))
    by_name = find_tokenizer("acme/tiny-chat", None, "/models/on-another-host")
    assert by_name.source == "hf-cache"
    empty = tmp_path / "weights-only"
    empty.mkdir()
    none = find_tokenizer("m", None, str(empty))
    assert (none.source, none.path) == ("bytes", None)
    assert str(empty) in none.note and "Hugging Face cache" in none.note
    assert "neither" in none.note and "'m'" in none.note
    # A replica whose root is its served name (an HF id it downloaded): the name once.
    same = find_tokenizer("acme/not-cached", None, "acme/not-cached")
    assert same.source == "bytes" and "neither" not in same.note
    assert same.note.count("'acme/not-cached'") == 2  # the root, and the cache it was not in


async def test_a_lone_tokenizer_flag_applies_to_the_one_served_model(qwen_dir: str) -> None:
    one = HasherSet([], default_tokenizer=qwen_dir)
    await one.discover(["m"], lambda model: None)
    assert one.tokenizers() == {"m": {"source": "config", "path": qwen_dir}}
    several = HasherSet([], default_tokenizer=qwen_dir)
    with pytest.raises(TokenizerConfigError, match="--model NAME"):
        await several.discover(["a", "b"], lambda model: None)


def replica_app(root: str | None, adapter: str | None = None) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/health":
            return httpx.Response(200)
        if path == "/metrics":
            return httpx.Response(200, text='vllm:cache_config_info{block_size="16"} 1.0\n')
        if path == "/v1/models":
            card: dict[str, Any] = {"id": "m", "object": "model"}
            if root is not None:
                card["root"] = root
            cards = [card]
            if adapter is not None:  # as vLLM lists a LoRA adapter: its folder, its model
                cards.append({"id": "sql-lora", "object": "model", "root": adapter,
                              "parent": "m"})
            return httpx.Response(200, json={"object": "list", "data": cards})
        if path == "/v1/chat/completions":
            return httpx.Response(200, json={
                "id": "x", "object": "chat.completion", "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
        return httpx.Response(404)
    return httpx.MockTransport(handler)


@asynccontextmanager
async def gateway(root: str | None, adapter: str | None = None,
                  **settings: Any) -> AsyncIterator[httpx.AsyncClient]:
    overrides = {"replicas": [{"id": "a", "url": "http://a", "kv_events": {
        "endpoint": "tcp://127.0.0.1:1"}}], "health_interval": 3600.0, **settings}
    app = create_app(load_settings(overrides=overrides, env={}),
                     transport=lambda rid: replica_app(root, adapter))
    async with LifespanManager(app) as manager, httpx.AsyncClient(
            transport=httpx.ASGITransport(app=manager.app), base_url="http://gw") as client:
        yield client


async def test_the_replicas_model_folder_is_found_and_shown(qwen_dir: str) -> None:
    async with gateway(qwen_dir, policy="prefix") as client:
        ready = (await client.get("/ready")).json()
        metrics = (await client.get("/metrics")).text
        replicas = (await client.get("/admin/replicas")).json()["replicas"]
        body = {"model": "m", "messages": [{"role": "system", "content": "rules " * 200},
                                           {"role": "user", "content": "hi"}]}
        await client.post("/v1/chat/completions", json=body)
        again = await client.post("/v1/chat/completions", json=body)
    assert ready["tokenizers"] == {"m": {"source": "replica-root", "path": qwen_dir}}
    assert 'prefixgate_tokenizer_info{model="m",source="replica-root"} 1.0' in metrics
    assert replicas[0]["tokenizer"] == {"source": "replica-root", "path": qwen_dir}
    assert int(again.headers["x-prefixgate-matched-tokens"]) >= 192  # real tokens, real blocks


async def test_a_lora_adapter_renders_with_its_base_models_tokenizer(
        qwen_dir: str, tmp_path: Path) -> None:
    """vLLM renders an adapter's requests with its base model's tokenizer and template; the
    adapter's own folder holds weights only."""
    weights = tmp_path / "sql-lora"
    weights.mkdir()
    async with gateway(qwen_dir, adapter=str(weights), policy="prefix") as client:
        ready = (await client.get("/ready")).json()
    assert ready["tokenizers"]["sql-lora"] == {"source": "replica-root", "path": qwen_dir}


async def test_a_lone_tokenizer_flag_covers_a_model_and_its_adapters(
        qwen_dir: str, tmp_path: Path) -> None:
    async with gateway("/models/elsewhere", adapter=str(tmp_path), tokenizer=qwen_dir,
                       policy="prefix") as client:
        ready = (await client.get("/ready")).json()
    assert ready["tokenizers"]["m"]["source"] == ready["tokenizers"]["sql-lora"]["source"] == \
        "config"


async def test_precise_without_a_tokenizer_says_what_it_falls_back_to(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        async with gateway("/models/on-another-host") as client:
            ready = (await client.get("/ready")).json()
    assert ready["tokenizers"]["m"]["source"] == "bytes"
    messages = [r.getMessage() for r in caplog.records]
    assert any("model m: no tokenizer" in m and "byte prefix" in m for m in messages)
    assert any("policy precise: model m has no tokenizer" in m and "speculative" in m
               for m in messages)


BRACKETS = ("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant] {% endif %}")


async def test_the_replicas_chat_template_is_the_one_routing_renders_with(
        qwen_dir: str, tmp_path: Path) -> None:
    """vLLM started with --chat-template renders with it, whatever the folder holds: the
    gateway given the same value renders the same prompt, found folder or configured."""
    file = tmp_path / "brackets.jinja"
    file.write_text(BRACKETS)
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    configured = HasherSet(load_settings(overrides={"models": [
        {"name": "m", "tokenizer": qwen_dir, "chat_template": str(file)}]}).models)
    assert configured.get("m").renderer.render_chat(chat) == "[user] hi\n[assistant] "
    found = HasherSet([], default_chat_template=BRACKETS)  # the template itself
    await found.discover(["m"], lambda model: qwen_dir)
    assert found.get("m").renderer.render_chat(chat) == "[user] hi\n[assistant] "
    plain = HasherSet([])
    await plain.discover(["m"], lambda model: qwen_dir)
    assert plain.get("m").renderer.render_chat(chat).startswith("<|im_start|>user\nhi")
    with pytest.raises(TokenizerConfigError, match="does not exist"):
        HasherSet([], default_chat_template=str(tmp_path / "missing.jinja"))
    several = HasherSet([], default_chat_template=BRACKETS)
    with pytest.raises(TokenizerConfigError, match="--chat-template was given without"):
        await several.discover(["a", "b"], lambda model: qwen_dir)
