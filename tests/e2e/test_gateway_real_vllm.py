"""The gateway in front of two real vLLM-on-CPU replicas, driven by the openai client.

qwen2-tiny (Qwen2 architecture, dummy weights, the real Qwen3 tokenizer) with a
96-block KV cache per replica; the text is noise, the prefix cache, scheduler,
metrics and KV events are vLLM's own. Tests run in file order: the last one
kills and restarts a replica.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from engine.pool.scrape import parse_vllm_metrics
from engine.tokenizer import HFRenderer, bundled_qwen_tokenizer_dir
from engine.vllm.local import LocalReplica, VllmCpuSetup
from gateway.prompt.bounds import ModelTemplate
from gateway.prompt.render import PromptHasher
from gateway.request.prompt_shapes import prompt_of
from tests.chat_corpus import CHATS, PARTS_TEMPLATE, PARTS_TEMPLATE_CHATS, VLLM_MESSAGE_CHATS
from tests.support.gateway import GatewayProcess
from tests.support.waiting import wait_until

from .conftest import MODEL, gateway_settings, model_dir

pytestmark = pytest.mark.e2e

SYSTEM = ("You are the support assistant of ACME Corporation. Answer politely, cite the "
          "policy section, never invent order numbers. ") * 8


def client(gw: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0, timeout=120)


@pytest.fixture()
def events_only_gateway(vllm_pair: list[LocalReplica]) -> Iterator[GatewayProcess]:
    """precise without speculation: what its index holds, only the replicas' events said."""
    gw = GatewayProcess(gateway_settings(vllm_pair, VllmCpuSetup.locate(),
                                         policy_options={"speculative_ttl_seconds": 0}))
    try:
        yield gw.start(timeout=120)
    finally:
        gw.stop()


def admin(gw: GatewayProcess) -> dict[str, dict]:
    return {r["id"]: r for r in httpx.get(gw.url + "/admin/replicas").json()["replicas"]}


def hits(replica: LocalReplica) -> float:
    return parse_vllm_metrics(httpx.get(replica.info.base_url + "/metrics").text).prefix_hits


def test_chat_and_completions_with_real_cache_hits(real_gateway: GatewayProcess) -> None:
    c = client(real_gateway)
    messages: list[Any] = [{"role": "system", "content": SYSTEM},
                           {"role": "user", "content": "Hi!"}]
    first = c.chat.completions.with_raw_response.create(model=MODEL, messages=messages,
                                                         max_tokens=4)
    second = c.chat.completions.with_raw_response.create(
        model=MODEL, messages=[messages[0], {"role": "user", "content": "Where is my order?"}],
        max_tokens=4)
    assert first.headers["x-prefixgate-replica"] == second.headers["x-prefixgate-replica"]
    usage = second.parse().usage
    assert usage is not None and usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens
    assert cached is not None and cached >= 128
    assert int(second.headers["x-prefixgate-matched-tokens"]) == cached

    stream = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    last = chunks[-1].usage
    assert last is not None and last.completion_tokens == 6
    assert last.prompt_tokens_details is not None
    assert (last.prompt_tokens_details.cached_tokens or 0) >= 128

    done = c.completions.create(model=MODEL, prompt=SYSTEM + "Answer:", max_tokens=4)
    assert done.choices[0].text is not None
    assert done.usage is not None and done.usage.completion_tokens == 4
    pieces = list(c.completions.create(model=MODEL, prompt=SYSTEM + "Answer:", max_tokens=4,
                                       stream=True))
    assert sum(1 for p in pieces if p.choices and p.choices[0].text) >= 1
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="not-served", messages=messages)


def test_rendered_ids_equal_vllm_tokenize(vllm_pair: list[LocalReplica]) -> None:
    hasher = PromptHasher(HFRenderer(str(model_dir())))
    url = vllm_pair[0].info.base_url + "/tokenize"
    for chat in CHATS + VLLM_MESSAGE_CHATS:
        ours = hasher.token_ids(MODEL, chat, "chat")
        theirs = httpx.post(url, json={"model": MODEL, "add_generation_prompt": True, **chat},
                            timeout=30).json()
        assert ours == theirs["tokens"], chat
    # a template that loops over a message's parts gets every content as parts from vLLM
    # (which it trims here); a gateway configured with the replica's --chat-template
    parts = PromptHasher(ModelTemplate(HFRenderer(str(model_dir()), chat_template=PARTS_TEMPLATE)))
    for chat in PARTS_TEMPLATE_CHATS:
        ours = parts.token_ids(MODEL, chat, "chat")
        theirs = httpx.post(url, json={"model": MODEL, "add_generation_prompt": True,
                                       "chat_template": PARTS_TEMPLATE, **chat}, timeout=30).json()
        assert ours == theirs["tokens"], chat


def test_tokenize_detokenize_and_models_answer_as_vllm(real_gateway: GatewayProcess,
                                                       vllm_pair: list[LocalReplica]) -> None:
    direct = vllm_pair[0].info.base_url
    body = {"model": MODEL, "prompt": SYSTEM + "Where is my order?"}
    through = httpx.post(real_gateway.url + "/tokenize", json=body, timeout=30)
    assert through.status_code == 200
    tokens = through.json()
    assert tokens == httpx.post(direct + "/tokenize", json=body, timeout=30).json()
    assert tokens["count"] == len(tokens["tokens"]) > 100 and tokens["max_model_len"] == 2048
    back = httpx.post(real_gateway.url + "/detokenize",
                      json={"model": MODEL, "tokens": tokens["tokens"]}, timeout=30)
    assert back.status_code == 200 and back.json()["prompt"] == body["prompt"]

    (card,) = httpx.get(direct + "/v1/models").json()["data"]
    c = client(real_gateway)
    (listed,) = c.models.list().data
    extra = listed.model_extra or {}
    assert (listed.id, listed.owned_by, extra["root"], extra["max_model_len"]) == (
        card["id"], card["owned_by"], card["root"], card["max_model_len"])
    assert extra["max_model_len"] == 2048 and extra["permission"]
    assert c.models.retrieve(MODEL).model_extra["max_model_len"] == 2048  # type: ignore[index]
    version = httpx.get(real_gateway.url + "/version").json()
    assert version["version"] == httpx.get(direct + "/version").json()["version"]
    # each replica's /tokenize gave the gateway's own token ids on every probe
    checks: dict = {}

    def checked() -> bool:
        ready = httpx.get(real_gateway.url + "/ready", timeout=10).json()
        checks.update(ready["tokenizers"][MODEL].get("render_checks") or {})
        return len(checks) == len(vllm_pair)
    wait_until(checked, 60, "render checks of both replicas")
    assert {c["result"] for c in checks.values()} == {"match"}, checks
    assert all(c["detail"].startswith("5 probes") for c in checks.values()), checks


def test_a_lone_surrogate_gets_vllms_own_answer(real_gateway: GatewayProcess,
                                               vllm_pair: list[LocalReplica]) -> None:
    """``"\\ud800"`` is valid JSON no tokenizer takes: vLLM's 400, the same through the
    gateway (which forwards it, not its own 500)."""
    direct = vllm_pair[0].info.base_url
    for path, body in [("/v1/completions", {"prompt": "hi \ud800", "max_tokens": 2}),
                       ("/v1/chat/completions", {"max_tokens": 2, "messages": [
                           {"role": "user", "content": "\udfff"}]})]:
        raw = json.dumps({"model": MODEL, **body}).encode()  # escaped: orjson refuses it
        answers = [httpx.post(url + path, content=raw, timeout=30,
                              headers={"content-type": "application/json"})
                   for url in (direct, real_gateway.url)]
        assert [a.status_code for a in answers] == [400, 400], path
        assert answers[0].json()["error"] == answers[1].json()["error"], path


def test_responses_follow_up_lands_where_vllm_stored_it(real_gateway: GatewayProcess,
                                                        vllm_pair: list[LocalReplica]) -> None:
    body = {"model": MODEL, "input": "Say hello.", "max_output_tokens": 4}
    direct = httpx.post(vllm_pair[0].info.base_url + "/v1/responses", json=body, timeout=120)
    through = httpx.post(real_gateway.url + "/v1/responses", json=body, timeout=120)
    assert through.status_code == direct.status_code, (through.text, direct.text)
    if direct.status_code != 200:  # vLLM on CPU refuses it for this model: as vLLM does
        print(f"\nvLLM answers /v1/responses {direct.status_code}: {direct.text[:200]}")
        assert through.json()["error"]["message"] == direct.json()["error"]["message"]
        return
    c = client(real_gateway)
    first = c.responses.with_raw_response.create(model=MODEL, input="Say hello.",
                                                 max_output_tokens=4)
    home, answer = first.headers["x-prefixgate-replica"], first.parse()
    assert answer.object == "response" and answer.status in ("completed", "incomplete")
    follow = c.responses.with_raw_response.create(
        model=MODEL, input="Again.", previous_response_id=answer.id, max_output_tokens=4)
    assert follow.headers["x-prefixgate-replica"] == home
    assert follow.parse().previous_response_id == answer.id
    holders = {r.info.replica_id: httpx.get(
        f"{r.info.base_url}/v1/responses/{answer.id}").status_code for r in vllm_pair}
    assert holders == {rid: 200 if rid == home else 404 for rid in holders}
    assert c.responses.retrieve(answer.id).id == answer.id
    events = [e.type for e in c.responses.create(model=MODEL, input="Stream.", stream=True,
                                                 max_output_tokens=4)]
    assert events[0] == "response.created" and events[-1] in ("response.completed",
                                                              "response.incomplete")


def test_anthropic_messages_answer_as_vllm_and_follow_their_system_prompt(
        real_gateway: GatewayProcess, vllm_pair: list[LocalReplica]) -> None:
    """vLLM's Anthropic Messages API (what Claude Code calls) through the gateway: the
    answer vLLM gives, and an agent's next turn (a tool use and its result after the
    same system prompt and task) on the replica that holds its prefix."""
    task = {"role": "user", "content": [{"type": "text", "text": "Where is my order?"}]}
    body = {"model": MODEL, "max_tokens": 4, "system": SYSTEM, "messages": [task]}
    direct = httpx.post(vllm_pair[0].info.base_url + "/v1/messages", json=body, timeout=120)
    through = httpx.post(real_gateway.url + "/v1/messages", json=body, timeout=120)
    assert through.status_code == direct.status_code, (through.text, direct.text)
    if direct.status_code != 200:  # this vLLM refuses it: the gateway answers the same
        print(f"\nvLLM answers /v1/messages {direct.status_code}: {direct.text[:200]}")
        return
    answer = through.json()
    assert answer["type"] == "message" and answer["usage"]["output_tokens"] >= 1
    turn = {**body, "messages": [
        task, {"role": "assistant", "content": [
            {"type": "tool_use", "id": "t1", "name": "lookup", "input": {"order": "A-1"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "shipped"}]}]}
    home = through.headers["x-prefixgate-replica"]
    replica = next(r for r in vllm_pair if r.info.replica_id == home)
    before = hits(replica)
    follow = httpx.post(real_gateway.url + "/v1/messages", json=turn, timeout=120)
    assert follow.status_code == 200, follow.text
    assert follow.headers["x-prefixgate-replica"] == home
    assert int(follow.headers["x-prefixgate-matched-tokens"]) >= 128
    assert hits(replica) - before >= 128  # the replica's own counter: a real hit
    with httpx.stream("POST", real_gateway.url + "/v1/messages", json={**body, "stream": True},
                      timeout=120) as stream:
        events = [line for line in stream.iter_lines() if line.startswith("event: ")]
    assert events[0] == "event: message_start" and events[-1] == "event: message_stop"
    counted = httpx.post(real_gateway.url + "/v1/messages/count_tokens",
                         json={"model": MODEL, "system": SYSTEM, "messages": [task]}, timeout=120)
    assert counted.status_code == 200 and counted.json()["input_tokens"] >= 128


def test_vllm_032s_newer_routes_answer_as_vllm(real_gateway: GatewayProcess,
                                               vllm_pair: list[LocalReplica]) -> None:
    """A batch of chats (routed by its first conversation, onto the replica that holds
    it: a real hit by the replica's counter), and the routes vLLM 0.32 serves or refuses
    by its flags (scale-out render, token-in-token-out, generative scoring): the gateway
    answers what vLLM answers. And the gateway's own error on the Messages API is in the
    shape vLLM's is."""
    conversation = [{"role": "system", "content": SYSTEM},
                    {"role": "user", "content": "Where is my parcel?"}]
    first = httpx.post(real_gateway.url + "/v1/chat/completions", timeout=120, json={
        "model": MODEL, "max_tokens": 2, "messages": conversation})
    home = first.headers["x-prefixgate-replica"]
    replica = next(r for r in vllm_pair if r.info.replica_id == home)
    batch = {"model": MODEL, "max_tokens": 2,
             "messages": [conversation, [{"role": "user", "content": "Hi"}]]}
    before = hits(replica)
    through = httpx.post(real_gateway.url + "/v1/chat/completions/batch", json=batch,
                         timeout=120)
    direct = httpx.post(replica.info.base_url + "/v1/chat/completions/batch", json=batch,
                        timeout=120)
    assert through.status_code == direct.status_code, (through.text, direct.text)
    if direct.status_code == 200:
        assert [c["index"] for c in through.json()["choices"]] == [0, 1]
        assert through.headers["x-prefixgate-replica"] == home
        assert hits(replica) - before >= 128
    else:
        print(f"\nvLLM answers /v1/chat/completions/batch {direct.status_code}")
    routes: list[tuple[str, dict[str, Any]]] = [
        ("/v1/messages/render", {"max_tokens": 4, "messages": conversation[1:]}),
        ("/inference/v1/generate", {"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 2}}),
        ("/v1/completions/derender", {"token_ids": [1, 2]}),
        ("/generative_scoring", {"query": "q"})]
    for path, body in routes:
        through = httpx.post(real_gateway.url + path, json={"model": MODEL, **body}, timeout=120)
        direct = httpx.post(replica.info.base_url + path, json={"model": MODEL, **body},
                            timeout=120)
        assert through.status_code == direct.status_code != 404, (path, through.text)
        if direct.status_code != 200:
            assert through.json() == direct.json(), path  # vLLM's own refusal, relayed
        elif path.endswith("/render"):
            assert through.json()["token_ids"] == direct.json()["token_ids"], path
    ask = {"model": "no-such-model", "max_tokens": 4, "messages": conversation[1:]}
    ours = httpx.post(real_gateway.url + "/v1/messages", json=ask, timeout=120)
    theirs = httpx.post(replica.info.base_url + "/v1/messages", json=ask, timeout=120)
    assert ours.status_code == theirs.status_code == 404
    assert set(ours.json()) == set(theirs.json()) == {"type", "error"}
    assert set(ours.json()["error"]) == set(theirs.json()["error"]) == {"type", "message"}


TOOL = {"name": "lookup", "description": "Find an order.",
        "parameters": {"type": "object", "properties": {"order": {"type": "string"}},
                       "required": ["order"]}}
RESPONSES_TURN = {"instructions": SYSTEM, "tools": [
    {"type": "function", **TOOL}, {"type": "function", "name": "now", "strict": True,
                                   "parameters": {"type": "object", "properties": {}}}],
    "input": [{"role": "user", "content": "Where is order A-1?"},
              {"type": "function_call", "call_id": "c1", "name": "lookup",
               "arguments": "{\"order\": \"A-1\"}"},
              {"type": "function_call_output", "call_id": "c1", "output": "shipped"},
              {"role": "user", "content": "And A-2?"}]}
MESSAGES_TURN = {"system": SYSTEM, "max_tokens": 4, "tools": [
    {"name": TOOL["name"], "description": TOOL["description"],
     "input_schema": TOOL["parameters"]}],
    "messages": [{"role": "user", "content": "Where is order A-1?"},
                 {"role": "assistant", "content": [
                     {"type": "text", "text": "Looking."},
                     {"type": "tool_use", "id": "t1", "name": "lookup",
                      "input": {"order": "A-1"}}]},
                 {"role": "user", "content": [
                     {"type": "tool_result", "tool_use_id": "t1", "content": "shipped"},
                     {"type": "text", "text": "And A-2?"}]}]}


# An answer of two text parts (vLLM reads the first), and a model's text after its own
# tool call (vLLM puts it into that call's assistant message).
ANSWER = {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
          "content": [{"type": "output_text", "text": "It shipped.", "annotations": []},
                      {"type": "output_text", "text": "Anything else?", "annotations": []}]}
RESPONSES_ANSWERED = {**RESPONSES_TURN, "input": [
    *RESPONSES_TURN["input"][:3], ANSWER, {"role": "user", "content": "And A-2?"}]}
RESPONSES_TEXT_AFTER_CALL = {**RESPONSES_TURN, "input": [
    *RESPONSES_TURN["input"][:2], {"role": "assistant", "content": "Checking."},
    *RESPONSES_TURN["input"][2:]]}


# A reasoning model's turns: its reasoning (a Responses reasoning item, Anthropic thinking)
# is the assistant's reasoning, which vLLM hands the template; routing reads on past it.
_TURN_INPUT: list[Any] = RESPONSES_TURN["input"]  # type: ignore[assignment]
RESPONSES_REASONED = {**RESPONSES_TURN, "input": [
    _TURN_INPUT[0],
    {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Look."}]},
    *_TURN_INPUT[1:]]}
_TURN_MESSAGES: list[Any] = MESSAGES_TURN["messages"]  # type: ignore[assignment]
MESSAGES_THOUGHT = {**MESSAGES_TURN, "messages": [
    _TURN_MESSAGES[0],
    {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "Look it up.", "signature": "s"},
        *_TURN_MESSAGES[1]["content"]]},
    *_TURN_MESSAGES[2:]]}


@pytest.mark.parametrize(("path", "kind", "body"), [
    ("/v1/responses/render", "responses", RESPONSES_REASONED),
    ("/v1/messages/render", "messages", MESSAGES_THOUGHT),
    ("/v1/responses/render", "responses", RESPONSES_TURN),
    ("/v1/responses/render", "responses", RESPONSES_ANSWERED),
    ("/v1/responses/render", "responses", RESPONSES_TEXT_AFTER_CALL),
    ("/v1/messages/render", "messages", MESSAGES_TURN)])
def test_an_agents_turn_renders_as_vllm_renders_it(vllm_pair: list[LocalReplica], path: str,
                                                   kind: str, body: dict[str, Any]) -> None:
    """An agent's turn on the Responses or Messages API (tools, a tool call and its result,
    a new question) renders, for routing, to the token ids vLLM's own render route gives:
    the blocks routing hashes are the replica's."""
    hasher = PromptHasher(HFRenderer(str(model_dir())))
    shape = prompt_of(kind, body)
    assert shape is not None and shape[0] == "chat"
    ours = hasher.token_ids(MODEL, {"model": MODEL, **shape[1]}, "chat")
    theirs = httpx.post(vllm_pair[0].info.base_url + path, json={"model": MODEL, **body},
                        timeout=60)
    assert theirs.status_code == 200, theirs.text
    assert ours == theirs.json()["token_ids"]


def test_precise_follows_kv_events_and_forgets_evictions(events_only_gateway: GatewayProcess,
                                                         vllm_pair: list[LocalReplica]) -> None:
    # Speculation (the blocks the gateway routed itself, until a TTL passes)
    # is off here so that nothing but the events decides; it is unit-tested.
    gateway = events_only_gateway
    target = vllm_pair[1]
    rid = target.info.replica_id
    prefix: list[Any] = [{"role": "system", "content": "Policy handbook, section 7. " * 40}]
    # Warm the prefix on one replica behind the gateway's back: only its events tell.
    direct = openai.OpenAI(base_url=target.info.base_url + "/v1", api_key="x", max_retries=0)
    direct.chat.completions.create(model=MODEL, messages=[*prefix,
                                   {"role": "user", "content": "warm"}], max_tokens=1)
    wait_until(lambda: (admin(gateway)[rid]["indexed_blocks"] or 0) >= 8, 30,
               "KV events of the warmed prefix in the precise index")

    before = hits(target)
    routed = client(gateway).chat.completions.with_raw_response.create(
        model=MODEL, messages=[*prefix, {"role": "user", "content": "first question"}],
        max_tokens=2)
    assert routed.headers["x-prefixgate-replica"] == rid
    assert int(routed.headers["x-prefixgate-matched-tokens"]) >= 256
    assert hits(target) - before >= 256

    # Evict it: fill the 96-block cache with other prompts, sent directly. The
    # prefix goes about half-way through; the events saying so are published
    # while the later fillers are prefilled, each of which takes longer on
    # these cores than an event takes to reach the gateway.
    for i in range(8):
        direct.chat.completions.create(model=MODEL, messages=[
            {"role": "system", "content": f"Unrelated filler document {i}. " * 90},
            {"role": "user", "content": "x"}], max_tokens=1)
    again = client(gateway).chat.completions.with_raw_response.create(
        model=MODEL, messages=[*prefix, {"role": "user", "content": "second question"}],
        max_tokens=2)
    usage = again.parse().usage
    assert usage is not None and usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens
    # The index forgot what the engine evicted: no stale promise of a warm prefix.
    assert int(again.headers["x-prefixgate-matched-tokens"]) == cached


def test_two_workers_route_as_one_gateway_on_real_caches(vllm_pair: list[LocalReplica]) -> None:
    """``--workers 2``: every request on a connection of its own, so either worker takes
    it; a prompt's later requests find its prefix in the real replica's cache (vLLM's own
    ``cached_tokens``) whichever worker placed the first."""
    gw = GatewayProcess(gateway_settings(vllm_pair, VllmCpuSetup.locate(), workers=2))
    try:
        gw.start(timeout=120)
        placed: dict[int, set[str]] = {}
        cached: list[int] = []
        for turn in range(4):
            for app in range(4):
                system = f"App {app} of the ACME group. " + SYSTEM
                with client(gw) as fresh:
                    raw = fresh.chat.completions.with_raw_response.create(
                        model=MODEL, max_tokens=2,
                        messages=[{"role": "system", "content": system},
                                  {"role": "user", "content": f"Question {turn}?"}])
                placed.setdefault(app, set()).add(raw.headers["x-prefixgate-replica"])
                usage = raw.parse().usage
                assert usage is not None and usage.prompt_tokens_details is not None
                if turn:
                    cached.append(usage.prompt_tokens_details.cached_tokens or 0)
        assert all(len(replicas) == 1 for replicas in placed.values()), placed
        assert min(cached) >= 128, cached
        workers = {line.split('worker="')[1].split('"')[0]
                   for line in httpx.get(gw.url + "/metrics", timeout=10).text.splitlines()
                   if line.startswith("prefixgate_requests_total{") and 'status="200"' in line
                   and not line.endswith(" 0.0")}
        assert workers == {"0", "1"}  # both took requests: each followed the other's
    finally:
        gw.stop()


def test_killed_replica_fails_over_then_rejoins(real_gateway: GatewayProcess,
                                               vllm_pair: list[LocalReplica]) -> None:
    c = client(real_gateway)
    by_id = {r.info.replica_id: r for r in vllm_pair}
    messages: list[Any] = [{"role": "user", "content": "Tell me a long story."}]
    with c.chat.completions.with_streaming_response.create(
            model=MODEL, messages=messages, stream=True, max_tokens=1500,
            extra_body={"ignore_eos": True}) as response:
        victim = by_id[response.headers["x-prefixgate-replica"]]
        chunks = iter(response.parse())
        next(chunks)
        victim.kill()  # mid-stream: 1500 tokens on these cores take far longer
        with pytest.raises(openai.APIError):
            for _ in chunks:
                pass
    survivors = set()
    for i in range(4):  # not yet streaming: retried on the survivor, nothing hangs
        raw = c.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": f"after the crash {i}"}],
            max_tokens=2)
        survivors.add(raw.headers["x-prefixgate-replica"])
    assert victim.info.replica_id not in survivors
    assert not admin(real_gateway)[victim.info.replica_id]["healthy"]

    started = time.monotonic()
    victim.restart()
    victim.wait_ready(timeout=300)
    print(f"\nreplica {victim.info.replica_id} restarted in {time.monotonic() - started:.1f}s")
    wait_until(lambda: admin(real_gateway)[victim.info.replica_id]["healthy"], 30,
               "the restarted replica back in rotation")
    served = {c.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": f"back {i}"}],
        max_tokens=2).headers["x-prefixgate-replica"] for i in range(6)}
    assert victim.info.replica_id in served


QWEN3_TEMPLATE = json.loads((Path(bundled_qwen_tokenizer_dir() or ".") / "tokenizer_config.json")
                            .read_text())["chat_template"]
DOCUMENTS_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% for d in documents or [] %}[{{ d.title }}] {{ d.text }}\n{% endfor %}"
    "{% if reasoning_effort %}effort: {{ reasoning_effort }}\n{% endif %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
_CHAT = [{"role": "system", "content": "Answer in one short sentence."},
         {"role": "user", "content": "Where is the station?"}]


@pytest.mark.parametrize(("template", "fields"), [
    (QWEN3_TEMPLATE, {"reasoning_effort": "none"}),
    (QWEN3_TEMPLATE, {"reasoning_effort": "high"}),
    (QWEN3_TEMPLATE, {"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": True}}),
    (QWEN3_TEMPLATE, {"chat_template_kwargs": {"enable_thinking": False,
                                               "add_generation_prompt": False}}),
    (DOCUMENTS_TEMPLATE, {"documents": [{"title": "A", "text": "alpha"}], "reasoning_effort": "low"}),
    (DOCUMENTS_TEMPLATE, {"chat_template_kwargs": {"documents": [{"title": "K", "text": "kw"}]}}),
], ids=["effort-none", "effort-high", "thinking-kept", "kwargs", "documents", "kwargs-documents"])
def test_the_variables_vllm_hands_a_template_render_the_same(
        vllm_pair: list[LocalReplica], template: str, fields: dict[str, Any]) -> None:
    """``reasoning_effort``, ``documents`` and ``chat_template_kwargs`` reach the template
    as vLLM hands them (its render route, the request's own template)."""
    body = {"messages": _CHAT, "chat_template": template, **fields}
    ours = PromptHasher(HFRenderer(str(model_dir()), chat_template=template)).token_ids(
        MODEL, {k: v for k, v in body.items() if k != "chat_template"}, "chat")
    theirs = httpx.post(vllm_pair[0].info.base_url + "/v1/chat/completions/render",
                        json={"model": MODEL, **body}, timeout=60)
    assert theirs.status_code == 200, theirs.text
    assert ours == theirs.json()["token_ids"]


def test_truncate_prompt_tokens_keeps_the_ends_routing_assumes(
        vllm_pair: list[LocalReplica]) -> None:
    """vLLM keeps a prompt's last N tokens (its first with ``truncation_side: "right"``):
    the gateway routes the first by load and the second on the blocks before the cut."""
    hasher = PromptHasher(HFRenderer(str(model_dir())))
    body = {"messages": [{"role": "system", "content": "Timetables and fares. " * 20},
                        {"role": "user", "content": "Is the 9:00 ferry full?"}]}
    ids = hasher.token_ids(MODEL, body, "chat")
    url = vllm_pair[0].info.base_url + "/v1/chat/completions/render"
    for side, kept in (("left", ids[-40:]), ("right", ids[:40])):
        theirs = httpx.post(url, json={"model": MODEL, **body, "truncate_prompt_tokens": 40,
                                       "truncation_side": side}, timeout=60)
        assert theirs.status_code == 200, theirs.text
        assert theirs.json()["token_ids"] == kept
    routed = hasher.describe(MODEL, {**body, "truncate_prompt_tokens": 40,
                                     "truncation_side": "right"}, "chat", 32)
    assert routed.block_hashes == hasher.describe(MODEL, body, "chat", 32).block_hashes[:1]
    assert hasher.describe(MODEL, {**body, "truncate_prompt_tokens": 40}, "chat",
                           32).block_hashes == ()
