"""Many requests of one app compared: exactly the spans that vary, and what never does."""

from __future__ import annotations

import random
from typing import Any

import pytest

from gateway.lint.batch import BatchLinter
from gateway.lint.linter import Linter
from gateway.lint.variance import Atomizer
from gateway.prompt.render import PromptHasher

TEMPLATE = ("You are the support assistant of Acme Corp. Our returns policy is effective "
            "2026-06-01 and applies to all orders. The customer is {name}, a {tier} member. "
            "This is request number {count} from this account today. Be concise, friendly and "
            "precise; never promise a delivery date.")
FIRST = ["Alice", "Bruno", "Chiara", "Dmitri", "Emeka", "Fatima", "Goran", "Hana", "Ivan",
         "Jun", "Kwame", "Lena", "Mateo", "Nadia", "Omar", "Petra", "Quentin", "Rosa", "Sven",
         "Tariq"]
LAST = ["Smith", "Rossi", "Novak", "Okafor", "Haddad", "Ivanova", "Tanaka", "Kowalski",
        "Silva", "Müller", "Dubois", "Jensen", "Moreau", "Santos", "Yilmaz", "Larsen", "Costa",
        "Weber", "Lindqvist", "Mensah"]
TIERS = ["gold", "silver", "platinum"]
BLOCK = 16


def app_requests(n: int = 20, seed: int = 4) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    rnd = random.Random(seed)
    values = []
    counts = rnd.sample(range(2, 900), n)
    for i in range(n):
        values.append({"name": f"{FIRST[i]} {LAST[(i * 7) % n]}", "tier": TIERS[i % 3],
                       "count": str(counts[i])})
    bodies = [{"model": "qwen", "messages": [
        {"role": "system", "content": TEMPLATE.format(**v)},
        {"role": "user", "content": f"Question {i}: where is my parcel?"}]}
        for i, v in enumerate(values)]
    return bodies, values


@pytest.fixture(scope="module")
def batch(linter: Linter) -> BatchLinter:
    return BatchLinter(linter, Atomizer())


def span_of(text: str, value: str) -> tuple[int, int]:
    start = text.index(value)
    return start, start + len(value)


def test_exactly_the_varying_spans_are_reported(batch: BatchLinter) -> None:
    bodies, values = app_requests()
    report = batch.lint(bodies, BLOCK)
    assert len(report.groups) == 1
    group = report.groups[0]
    first = TEMPLATE.format(**values[0])
    expected = [("messages[0].content", *span_of(first, values[0][key]), kind)
                for key, kind in (("name", "name"), ("tier", "category"), ("count", "counter"))]
    assert [(v.path, v.start, v.end, v.kind) for v in group.varying] == expected
    name, tier, count = group.varying
    assert name.distinct == 20 and tier.distinct == 3 and count.distinct == 20
    assert set(tier.examples) == set(TIERS)
    assert name.text == values[0]["name"] and name.examples[1] == values[1]["name"]


def test_every_request_gets_its_own_varying_spans(batch: BatchLinter) -> None:
    bodies, values = app_requests()
    report = batch.lint(bodies, BLOCK)
    for request, value in zip(report.reports, values):
        text = TEMPLATE.format(**value)
        warned = {(f.start, f.end) for f in request.findings if f.severity == "warning"}
        assert warned == {span_of(text, value["name"]), span_of(text, value["tier"]),
                          span_of(text, value["count"])}


def test_a_fixed_date_that_never_varies_drops_to_info(batch: BatchLinter, linter: Linter) -> None:
    bodies, _ = app_requests()
    alone = linter.lint(bodies[0], BLOCK)
    assert [f.severity for f in alone.findings if f.kind == "date"] == ["warning"]
    together = batch.lint(bodies, BLOCK).reports[0]
    date = next(f for f in together.findings if f.kind == "date")
    assert date.severity == "info" and "same in all 20 requests" in date.detail


def test_common_prefix_matches_the_tokenizer(batch: BatchLinter, hasher: PromptHasher) -> None:
    bodies, _ = app_requests()
    group = batch.lint(bodies, BLOCK).groups[0]
    ids = [hasher.token_ids("qwen", body, "chat") for body in bodies]
    common = 0
    while all(len(i) > common and i[common] == ids[0][common] for i in ids):
        common += 1
    assert group.common_prefix_tokens == common
    assert group.cacheable_common_prefix_tokens == common - common % BLOCK
    report = batch.lint(bodies, BLOCK)
    assert report.reports[0].cacheable_prefix_tokens == common - common % BLOCK


def tool(name: str, description: str, reorder: bool = False) -> dict[str, Any]:
    function = {"name": name, "description": description,
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}
    if reorder:
        function = {"parameters": function["parameters"], "name": name,
                    "description": description}
    return {"type": "function", "function": function}


def test_tool_order_key_order_salt_and_invisible_differences(batch: BatchLinter) -> None:
    system = "You are a research assistant. Cite sources. " * 4
    bodies = []
    for i in range(6):
        tools = [tool("search", "Search the web.", reorder=i % 2 == 1),
                 tool("fetch", "Fetch a page.")]
        if i % 3 == 2:
            tools.reverse()
        content = system.replace("Cite sources.", "Cite\u00a0sources.") if i == 4 else system
        bodies.append({"messages": [{"role": "system", "content": content},
                                    {"role": "user", "content": f"topic {i}"}],
                       "tools": tools, "cache_salt": f"salt-{i:04d}-{i * 7919:06d}"})
    group = batch.lint(bodies, BLOCK).groups[0]
    kinds = {f.kind: f for f in group.findings}
    assert set(kinds) == {"tool_order", "unstable_json", "cache_salt", "unicode"}
    assert kinds["unstable_json"].path.startswith("tools[")
    assert kinds["unicode"].path == "messages[0].content"
    assert all(f.severity == "warning" for f in group.findings)
    assert group.varying == ()


def test_requests_of_different_apps_are_not_compared(batch: BatchLinter) -> None:
    bodies, _ = app_requests(6)
    other = [{"messages": [{"role": "system", "content": f"Translate into French. Style {i}."},
                           {"role": "user", "content": "Hello"}], "user": "app-2"}
             for i in range(3)]
    report = batch.lint(bodies + other, BLOCK)
    assert [g.requests for g in report.groups] == [tuple(range(6)), (6, 7, 8)]
