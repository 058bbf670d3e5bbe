"""The prompt linter through the real gateway process, with the official openai client."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionFunctionToolParam
from prometheus_client.parser import text_string_to_metric_families

from tests.support.gateway import GatewayProcess
from tests.support.sim import SimProcess
from tests.support.waiting import wait_until

from .conftest import MODEL, gateway_settings, sim_args

POLICY = ("You are the concierge of the Harbor Hotel. Check-in is from 15:00, check-out until "
          "11:00. Answer in the guest's language, be warm and brief, and never quote prices "
          "that are not in the rate sheet. ") * 4


@pytest.fixture(scope="module", params=["thread", "process"])
def lint_gateway(request: pytest.FixtureRequest) -> Iterator[GatewayProcess]:
    """The live linter in a thread of the gateway, or in a process of its own."""
    sims = [SimProcess(sim_args(20 + i)) for i in range(2)]
    gateway = GatewayProcess(gateway_settings(sims, policy="prefix", max_body_bytes=100_000,
                                              lint={"worker": request.param}))
    try:
        for sim in sims:
            sim.start()
        yield gateway.start()
    finally:
        gateway.stop()
        for sim in sims:
            sim.close()


def client(gateway: GatewayProcess, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0)


def ask(api: openai.OpenAI, system: str, question: str = "Is breakfast included?") -> dict:
    raw = api.chat.completions.with_raw_response.create(
        model=MODEL, max_tokens=4, messages=[{"role": "system", "content": system},
                                             {"role": "user", "content": question}])
    raw.parse()
    return dict(raw.headers)


def timestamp_findings(gateway: GatewayProcess) -> float:
    text = httpx.get(gateway.url + "/metrics").text
    return sum(s.value for family in text_string_to_metric_families(text)
               for s in family.samples
               if s.name == "prefixgate_lint_findings_total" and s.labels["kind"] == "timestamp")


def test_the_linter_runs_where_it_was_told(lint_gateway: GatewayProcess) -> None:
    assert lint_gateway.proc is not None
    linters = [pid for pid in _children(lint_gateway.proc.pid)
               if b"gateway.server.lint_process" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(linters) == (lint_gateway.settings["lint"]["worker"] == "process")


def _children(parent: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text(errors="replace")
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == parent:
                found.append(int(entry))
    return found


def test_lint_header_on_a_timestamp_in_the_system_prompt(lint_gateway: GatewayProcess) -> None:
    api = client(lint_gateway, "app-one")
    stamp = "Current time: 2026-11-30 15:25:07 UTC."
    first = ask(api, POLICY + stamp)  # goes out before the linter has seen its prefix
    ask(api, POLICY)
    # The counter exists at 0 from start-up: wait for the first request's finding.
    wait_until(lambda: timestamp_findings(lint_gateway) >= 1, what="the first request linted")
    stamped = ask(api, POLICY + stamp, "Is parking free?")
    clean = ask(api, POLICY, "Is parking free?")
    assert "x-prefixgate-lint" not in first
    assert stamped["x-prefixgate-lint"] == "1"
    assert clean["x-prefixgate-lint"] == "0"
    assert stamped["x-prefixgate-replica"] in {"s0", "s1"}


def test_lint_endpoint_answers(lint_gateway: GatewayProcess) -> None:
    body = {"model": MODEL, "messages": [
        {"role": "system", "content": POLICY + "Guest: Maria Lopez, maria.lopez@gmail.com."},
        {"role": "user", "content": "Can I check in early?"}]}
    report = httpx.post(lint_gateway.url + "/v1/prompt/lint", json=body, timeout=30).json()
    assert report["object"] == "prompt.lint" and report["model"] == MODEL
    assert {(f["kind"], f["text"]) for f in report["findings"]} == {
        ("email", "maria.lopez@gmail.com"), ("name", "Maria Lopez")}
    assert report["prompt_tokens"] > report["cacheable_prefix_tokens_if_fixed"] > 0
    too_big = httpx.post(lint_gateway.url + "/v1/prompt/lint", timeout=30, json={
        "messages": [{"role": "user", "content": "x" * 150_000}]})
    assert too_big.status_code == 413


def test_drift_after_the_template_changes(lint_gateway: GatewayProcess) -> None:
    api = client(lint_gateway, "app-two")
    for i in range(14):
        ask(api, POLICY, f"question {i}")
    for i in range(6):
        # The new release prepends a per-request timestamp: the prefix stops being shared.
        ask(api, f"[{time.strftime('%Y-%m-%d %H:%M:%S')}.{i:03d}] " + POLICY)

    def report() -> tuple[dict, dict | None]:
        drift = httpx.get(lint_gateway.url + "/admin/drift", timeout=10).json()
        return drift, next((e for e in drift["events"] if e["model"] == MODEL), None)

    # The linter reads each request off the serving loop once it has left (a worker
    # thread that polls its queue): the report follows the last request by a moment.
    wait_until(lambda: report()[1] is not None, what="the drift event")
    drift, event = report()
    assert event is not None
    assert event["path"] == "messages[0].content" and event["kind"] == "timestamp"
    assert event["share_before"] > 0.9 and event["share_after"] < 0.5
    assert event["now"]["chars"] and event["now"]["hash"] != event["now_other"]["hash"]
    assert POLICY[:40] not in str(drift)  # no prompt text in the admin report ...
    lines = [x for x in lint_gateway.log().splitlines() if "prefix drift" in x]
    assert lines and not any(POLICY[:20] in x for x in lines)  # ... nor in the log


TOOLS: list[ChatCompletionFunctionToolParam] = [
    {"type": "function", "function": {"name": name, "description": f"{name} for the guest",
                                      "parameters": {"type": "object", "properties": {}}}}
    for name in ("transfer_funds_to_offshore_account", "read_guest_passport")]


def test_drift_groups_show_no_tool_names_to_a_caller_who_may_not_read_prompts(
        lint_gateway: GatewayProcess) -> None:
    api = client(lint_gateway, "app-three")
    for i in range(3):
        api.chat.completions.create(model=MODEL, max_tokens=4, tools=TOOLS, messages=[
            {"role": "system", "content": POLICY}, {"role": "user", "content": f"q {i}"}])

    def shapes() -> list[str]:
        groups = httpx.get(lint_gateway.url + "/admin/drift", timeout=10).json()["groups"]
        return [g["shape"] for g in groups if "tools: -" not in g["shape"]]

    wait_until(lambda: bool(shapes()), what="the tool group learned")
    assert shapes()[0].startswith("1 system; tools: 2 (names hidden, ")
    drift = httpx.get(lint_gateway.url + "/admin/drift", timeout=10).text
    assert "transfer_funds" not in drift and "passport" not in drift
