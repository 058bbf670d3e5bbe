"""Every request shape routes by prefix: the second request goes where the first left its blocks.

Four simulated replicas behind the real gateway (default policy), the
official ``openai`` client as the caller. For each shape a first request
leaves a long prefix on one replica; a second request sharing that prefix
must land there, with ``x-prefixgate-matched-tokens`` covering the shared
full blocks and — with the real tokenizer — equal to the replica's own
``usage.prompt_tokens_details.cached_tokens``.

Among the shapes are those a piece-level memo alone would miss: a user
message that grows from request to request, and a shared document with a
varying question in the same message.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from engine.tokenizer import HFRenderer, bundled_qwen_tokenizer_dir
from tests.support.gateway import GatewayProcess
from tests.support.sim import SimProcess

from .conftest import MODEL, gateway_settings, running_sims, sim_args

BLOCK = 16
STORY = ("The harbour master counted the boats twice each morning, wrote the tally in a "
         "green ledger, and walked the pier to check every mooring line. ")
DOCUMENT = ("Section {n}. Refunds are issued within thirty days of delivery when the item is "
            "unused and in its original packaging; shipping costs are not refunded. ")
TOOLS = [{"type": "function", "function": {
    "name": "lookup_order", "description": "Find an order by its number.",
    "parameters": {"type": "object", "properties": {"order": {"type": "string"}},
                   "required": ["order"]}}},
    {"type": "function", "function": {
        "name": "refund", "description": "Refund an order.",
        "parameters": {"type": "object", "properties": {"order": {"type": "string"},
                                                        "amount": {"type": "number"}},
                       "required": ["order", "amount"]}}}]


@pytest.fixture(scope="module")
def four_sims() -> Iterator[list[SimProcess]]:
    with running_sims([sim_args(i, "--block-size", str(BLOCK), "--num-blocks", "4096")
                       for i in range(4)]) as sims:
        yield sims


@pytest.fixture(scope="module")
def gateway(four_sims: list[SimProcess]) -> Iterator[GatewayProcess]:
    gw = GatewayProcess(gateway_settings(four_sims, policy="prefix"))
    try:
        yield gw.start()
    finally:
        gw.stop()


@pytest.fixture(scope="module")
def qwen() -> HFRenderer:
    folder = bundled_qwen_tokenizer_dir()
    assert folder
    return HFRenderer(folder)


def chat(gw: GatewayProcess, messages: list[dict[str, Any]], **extra: Any) -> tuple[str, int, int]:
    """(replica, matched tokens header, replica's cached tokens) of one chat request."""
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, max_tokens=4, temperature=0, **extra)  # type: ignore[arg-type]
    reply = raw.parse()
    details = reply.usage.prompt_tokens_details if reply.usage else None
    return (raw.headers["x-prefixgate-replica"], int(raw.headers["x-prefixgate-matched-tokens"]),
            (details.cached_tokens or 0) if details else 0)


def complete(gw: GatewayProcess, prompt: str | list[int]) -> tuple[str, int, int]:
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
    raw = client.completions.with_raw_response.create(model=MODEL, prompt=prompt, max_tokens=4,
                                                      temperature=0)
    reply = raw.parse()
    details = reply.usage.prompt_tokens_details if reply.usage else None
    return (raw.headers["x-prefixgate-replica"], int(raw.headers["x-prefixgate-matched-tokens"]),
            (details.cached_tokens or 0) if details else 0)


def shared_full_blocks(first: list[int], second: list[int]) -> int:
    """Tokens in the full blocks two prompts share (what the engine can reuse)."""
    common = next((i for i, (a, b) in enumerate(zip(first, second)) if a != b),
                  min(len(first), len(second)))
    common = min(common, len(second) - 1)  # the last prompt token is always recomputed
    return common - common % BLOCK


def prompt_ids(qwen: HFRenderer, messages: list[dict[str, Any]], **extra: Any) -> list[int]:
    return qwen.chat_token_ids({"messages": messages, **extra})


def assert_routed_to_prefix(first: tuple[str, int, int], second: tuple[str, int, int],
                            shared: int) -> None:
    assert shared >= 8 * BLOCK, "the test's prompts must share a long prefix"
    assert second[0] == first[0], "the request sharing a prefix went to another replica"
    assert second[1] >= shared
    assert second[1] == second[2], "predicted cached tokens differ from the replica's count"


def test_chat_with_several_messages(gateway: GatewayProcess, qwen: HFRenderer) -> None:
    history = [{"role": "system", "content": "shapes-A " + STORY * 6},
               {"role": "user", "content": "How many boats were there?"},
               {"role": "assistant", "content": "Forty-two, on most mornings."},
               {"role": "user", "content": "And on Sundays?"}]
    follow = history + [{"role": "assistant", "content": "Fewer."},
                        {"role": "user", "content": "Why fewer?"}]
    first, second = chat(gateway, history), chat(gateway, follow)
    assert_routed_to_prefix(first, second, shared_full_blocks(prompt_ids(qwen, history),
                                                              prompt_ids(qwen, follow)))


def test_one_user_message_that_grows(gateway: GatewayProcess, qwen: HFRenderer) -> None:
    text = "shapes-B " + STORY * 8
    first = chat(gateway, [{"role": "user", "content": text}])
    grown = text + "\nAssistant said: forty-two.\nUser asks: and the green ledger?"
    second = chat(gateway, [{"role": "user", "content": grown}])
    assert_routed_to_prefix(first, second, shared_full_blocks(
        prompt_ids(qwen, [{"role": "user", "content": text}]),
        prompt_ids(qwen, [{"role": "user", "content": grown}])))
    third = chat(gateway, [{"role": "user", "content": grown + " And the pier?"}])
    assert third[0] == first[0] and third[1] == third[2] > second[1] - BLOCK


def test_shared_document_with_a_varying_question(gateway: GatewayProcess,
                                                 qwen: HFRenderer) -> None:
    document = "shapes-C " + "".join(DOCUMENT.format(n=n) for n in range(12))
    asks = [f"{document}\n\nQuestion: {q}" for q in
            ("Is shipping refunded?", "How long do I have to ask for a refund?")]
    first = chat(gateway, [{"role": "user", "content": asks[0]}])
    second = chat(gateway, [{"role": "user", "content": asks[1]}])
    assert_routed_to_prefix(first, second, shared_full_blocks(
        prompt_ids(qwen, [{"role": "user", "content": asks[0]}]),
        prompt_ids(qwen, [{"role": "user", "content": asks[1]}])))


def test_agent_loop_ending_on_tool_messages(gateway: GatewayProcess, qwen: HFRenderer) -> None:
    loop: list[dict[str, Any]] = [
        {"role": "system", "content": "shapes-D You are an order agent. " + STORY * 3},
        {"role": "user", "content": "Refund order 1234 in full."},
        {"role": "assistant", "content": "", "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "lookup_order", "arguments": json.dumps({"order": "1234"})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"total": 80.5})}]
    nxt = loop + [
        {"role": "assistant", "content": "", "tool_calls": [{
            "id": "call_2", "type": "function",
            "function": {"name": "refund",
                         "arguments": json.dumps({"order": "1234", "amount": 80.5})}}]},
        {"role": "tool", "tool_call_id": "call_2", "content": json.dumps({"ok": True})}]
    first, second = chat(gateway, loop, tools=TOOLS), chat(gateway, nxt, tools=TOOLS)
    assert_routed_to_prefix(first, second, shared_full_blocks(
        prompt_ids(qwen, loop, tools=TOOLS), prompt_ids(qwen, nxt, tools=TOOLS)))


def test_completions_with_a_text_prompt(gateway: GatewayProcess, qwen: HFRenderer) -> None:
    base = "shapes-E " + STORY * 6
    first, second = complete(gateway, base + "Q1: boats?"), complete(gateway, base + "Q2: pier?")
    shared = shared_full_blocks(qwen.text_token_ids(base + "Q1: boats?"),
                                qwen.text_token_ids(base + "Q2: pier?"))
    assert_routed_to_prefix(first, second, shared)


def test_completions_with_token_ids(gateway: GatewayProcess, qwen: HFRenderer) -> None:
    ids = qwen.text_token_ids("shapes-F " + STORY * 6, add_special_tokens=False)
    first, second = complete(gateway, ids + [100, 200]), complete(gateway, ids + [300, 400, 500])
    assert_routed_to_prefix(first, second, shared_full_blocks(ids + [100, 200],
                                                              ids + [300, 400, 500]))


def test_cache_salt_separates_prefixes(gateway: GatewayProcess, qwen: HFRenderer) -> None:
    messages = [{"role": "system", "content": "shapes-G " + STORY * 6},
                {"role": "user", "content": "Count the boats."}]
    first = chat(gateway, messages, extra_body={"cache_salt": "tenant-a"})
    again = chat(gateway, messages, extra_body={"cache_salt": "tenant-a"})
    other = chat(gateway, messages, extra_body={"cache_salt": "tenant-b"})
    unsalted = chat(gateway, messages)
    assert_routed_to_prefix(first, again, shared_full_blocks(prompt_ids(qwen, messages),
                                                             prompt_ids(qwen, messages)))
    assert other[1] == other[2] == 0  # another salt shares nothing, and the gateway knows it
    assert unsalted[1] == unsalted[2] == 0


# -- no tokenizer anywhere: the byte renderer still routes by prefix -----------------------------

@pytest.fixture(scope="module")
def byte_gateway(four_sims: list[SimProcess]) -> Iterator[GatewayProcess]:
    """No tokenizer configured, and the replicas report a model path this host lacks."""
    with running_sims([sim_args(10 + i, "--block-size", str(BLOCK), "--num-blocks", "4096",
                                "--model-root", "/models/not-on-this-host")
                       for i in range(2)]) as remote:
        settings = gateway_settings(remote, policy="prefix")
        settings.pop("models")
        for replica in settings["replicas"]:
            replica.pop("model")
        gw = GatewayProcess(settings)
        try:
            yield gw.start()
        finally:
            gw.stop()


def test_byte_mode_routes_by_prefix_and_says_so(byte_gateway: GatewayProcess,
                                                qwen: HFRenderer) -> None:
    ready = httpx.get(byte_gateway.url + "/ready").json()
    assert ready["tokenizers"] == {MODEL: {"source": "bytes", "path": None}}
    metrics = httpx.get(byte_gateway.url + "/metrics").text
    assert f'prefixgate_tokenizer_info{{model="{MODEL}",source="bytes"}} 1.0' in metrics
    replicas = httpx.get(byte_gateway.url + "/admin/replicas").json()["replicas"]
    assert {r["tokenizer"]["source"] for r in replicas} == {"bytes"}
    assert "no tokenizer" in byte_gateway.log()
    system = {"role": "system", "content": "shapes-H " + STORY * 8}
    firsts = [chat(byte_gateway, [system, {"role": "user", "content": f"Question {i}?"}])
              for i in range(2)]
    shared = shared_full_blocks(prompt_ids(qwen, [system, {"role": "user", "content": "Q0"}]),
                                prompt_ids(qwen, [system, {"role": "user", "content": "Q1"}]))
    assert firsts[1][0] == firsts[0][0]
    assert firsts[1][2] >= shared  # the replica really reused the system prompt
    assert firsts[1][1] >= shared // 2  # an estimate in byte mode, but it sees the prefix
