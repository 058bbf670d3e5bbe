"""Many requests of one app compared: exactly the spans that vary, and what never does."""

from __future__ import annotations

import random
import re
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


def tool(name: str, description: str, reorder: bool = False,
         reorder_outer: bool = False) -> dict[str, Any]:
    """``reorder``: the keys of its parameters in another order (the template writes them
    out as given); ``reorder_outer``: the function's own keys in another order (vLLM
    rebuilds those in a fixed order before the template sees them)."""
    parameters: dict[str, Any] = {"type": "object", "properties": {"q": {"type": "string"}}}
    if reorder:
        parameters = {"properties": parameters["properties"], "type": "object"}
    function = {"name": name, "description": description, "parameters": parameters}
    if reorder_outer:
        function = {"parameters": parameters, "name": name, "description": description}
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


POLICY = (" You are the support assistant of Northwind Outfitters. Be concise and friendly. "
          "Never promise refunds outside the 30-day return policy.")


def system_requests(*systems: str, model: str = "m") -> list[dict[str, Any]]:
    return [{"model": model, "messages": [{"role": "system", "content": system},
                                          {"role": "user", "content": "Hi"}]}
            for system in systems]


@pytest.mark.parametrize("head, one, other", [
    ("Tier: ", "gold", "golden"),
    ("Tier: ", "pro", "enterprise pro"),
    ("Ticket ", "4821", "48213"),
    ("Customer: ", "Jo Smith", "Joanna Smith"),
    ("Code ", "A", "AB"),
])
@pytest.mark.parametrize("reverse", [False, True])
def test_a_value_that_extends_another_varies_in_either_order(
        batch: BatchLinter, head: str, one: str, other: str, reverse: bool) -> None:
    """"gold" then "golden" is as much a varying span as "golden" then "gold": the span
    where they start to differ, both values, a warning in each request."""
    values = [other, one] if reverse else [one, other]
    report = batch.lint(system_requests(*(f"{head}{v}." + POLICY for v in values)), BLOCK)
    (group,) = report.groups
    assert group.cacheable_common_prefix_tokens == 0
    (span,) = group.varying
    assert (span.path, span.start, span.end) == ("messages[0].content", len(head),
                                                 len(head) + len(values[0]))
    assert span.examples == tuple(values) and span.distinct == 2
    assert span.token_start is not None and span.token_start <= group.common_prefix_tokens
    for request, value in zip(report.reports, values):
        warned = [(f.start, f.end, f.text) for f in request.findings if f.severity == "warning"]
        assert warned == [(len(head), len(head) + len(value), value)]
        assert request.cacheable_prefix_tokens == 0
    assert report.warnings == 2


@pytest.mark.parametrize("order", [(0, 1, 2), (1, 0, 2), (2, 1, 0), (1, 2, 0)])
def test_every_distinct_value_is_counted(batch: BatchLinter, order: tuple[int, int, int]) -> None:
    values = [["12", "120", "3"][i] for i in order]
    report = batch.lint(system_requests(*(f"You have {v} unread messages." + POLICY
                                          for v in values)), BLOCK)
    (span,) = report.groups[0].varying
    assert span.kind == "counter" and span.distinct == 3 and span.examples == tuple(values)
    for request, value in zip(report.reports, values):
        assert [f.text for f in request.findings if f.severity == "warning"] == [value]


def test_text_inserted_between_words_varies(batch: BatchLinter) -> None:
    texts = ["Hello world." + POLICY, "Hello big world." + POLICY]
    for ordered in (texts, texts[::-1]):
        group = batch.lint(system_requests(*ordered), BLOCK).groups[0]
        assert [v.examples for v in group.varying] == [tuple(
            "big world" if "big" in t else "world" for t in ordered)]
        assert group.varying[0].start == 6


@pytest.mark.parametrize("clean, odd, at, chars", [
    ("Tier: gold. Customer", "Tier: gold . Customer", 10, " "),
    ("Tier: gold. Customer", "Tier: gold\u00a0. Customer", 10, "\u00a0"),
    ("Tier: gold. Customer", "Tier: gold\u200b. Customer", 10, "\u200b"),
])
def test_an_invisible_character_inserted_before_a_word_or_a_stop(
        batch: BatchLinter, clean: str, odd: str, at: int, chars: str) -> None:
    """Inserted where the clean text has no space at all: still found (it was lost when the
    span was taken to be the "." after it, stripped of spaces on both sides)."""
    for systems, odd_index in (([clean + POLICY, odd + POLICY], 1),
                               ([odd + POLICY, clean + POLICY], 0)):
        group = batch.lint(system_requests(*systems), BLOCK).groups[0]
        (finding,) = group.findings
        assert (finding.kind, finding.request, finding.start, finding.end, finding.text) == (
            "unicode", odd_index, at, at + len(chars), chars)


INVISIBLE = [  # (clean, odd, the odd characters, where they start in the odd text)
    ("Northwind's support", "Northwind's\u200bsupport", "\u200b", 11),
    ("Northwind's support", "Northwind's support\u200b assistant"[:-10], "\u200b", 19),
    ("Rules:\nBe brief.", "Rules:\r\nBe brief.", "\r\n", 6),
    ("assistant. Be brief.", "assistant.\r\nBe brief.", "\r\n", 10),
    ("assistant. Be brief.", "assistant.\u00a0Be brief.", "\u00a0", 10),
    ("assistant. Be brief.", "assistant.  Be brief.", "  ", 10),
]


@pytest.mark.parametrize("clean, odd, chars, at", INVISIBLE)
@pytest.mark.parametrize("odd_first", [False, True])
def test_invisible_differences_are_found_in_either_order(
        batch: BatchLinter, clean: str, odd: str, chars: str, at: int, odd_first: bool) -> None:
    """An invisible difference is a `unicode` warning at the request and place that carry the
    odd characters, shown escaped, whichever request comes first; it is no varying text."""
    systems = [odd + POLICY, clean + POLICY] if odd_first else [clean + POLICY, odd + POLICY]
    odd_index = 0 if odd_first else 1
    report = batch.lint(system_requests(*systems), BLOCK)
    (group,) = report.groups
    assert group.varying == ()
    (finding,) = group.findings
    assert (finding.kind, finding.severity, finding.request) == ("unicode", "warning", odd_index)
    assert (finding.path, finding.start, finding.end, finding.text) == (
        "messages[0].content", at, at + len(chars), chars)
    assert repr(chars) in finding.detail and finding.token_start is not None
    odd_report, clean_report = report.reports[odd_index], report.reports[1 - odd_index]
    warned = [f for f in odd_report.findings if f.severity == "warning"]
    assert [(f.kind, f.start, f.end, f.text) for f in warned] == [("unicode", at, at + len(chars),
                                                                   chars)]
    assert odd_report.cacheable_prefix_tokens <= group.common_prefix_tokens
    assert clean_report.warnings == 0
    assert report.warnings == 2


def test_a_trailing_space_is_found_at_the_request_that_has_it(batch: BatchLinter) -> None:
    text = "You are Northwind's support assistant. Never promise refunds."
    for odd_first in (False, True):
        systems = [text + " ", text] if odd_first else [text, text + " "]
        group = batch.lint(system_requests(*systems), BLOCK).groups[0]
        (finding,) = group.findings
        assert (finding.kind, finding.request, finding.start, finding.end, finding.text) == (
            "unicode", 0 if odd_first else 1, len(text), len(text) + 1, " ")
        assert finding.suggestion.startswith("Strip trailing spaces")


def test_requests_of_different_models_are_not_compared(batch: BatchLinter) -> None:
    bodies = (system_requests("You are Northwind's support assistant." + POLICY, model="m1")
              + system_requests("You are a coding agent. Use the tools. Always run the tests "
                                "before you finish.", model="m2")
              + system_requests("You are Northwind's support assistant." + POLICY, model="m1"))
    report = batch.lint(bodies, BLOCK)
    assert [g.requests for g in report.groups] == [(0, 2), (1,)]
    assert all(g.varying == () and g.findings == () for g in report.groups)
    assert report.warnings == 0


def test_a_function_tools_own_key_order_is_not_unstable_json(batch: BatchLinter) -> None:
    """vLLM rebuilds {type, function: {name, description, parameters}} in that order before
    the template renders it: those keys' order never reaches the prompt. The order inside
    parameters does, and is still a warning."""
    system = "You are a research assistant. Cite sources. " * 4

    def bodies(**reorder: bool) -> list[dict[str, Any]]:
        return [{"model": "m", "messages": [{"role": "system", "content": system},
                                            {"role": "user", "content": f"topic {i}"}],
                 "tools": [tool("search", "Search the web.", **(reorder if i else {})),
                           tool("fetch", "Fetch a page.")]} for i in range(2)]

    report = batch.lint(bodies(reorder_outer=True), BLOCK)
    assert report.groups[0].findings == () and report.warnings == 0
    assert not any(f.kind == "unstable_json" for r in report.reports for f in r.findings)
    report = batch.lint(bodies(reorder=True), BLOCK)
    (finding,) = report.groups[0].findings
    assert (finding.kind, finding.path, finding.severity) == ("unstable_json", "tools[0]",
                                                              "warning")


WORDS = re.findall(r"\S+", "the shipment left our warehouse on March 3, 2024 and reached the "
                   "depot two days later; Maria Lopez signed for order 48213 at 14:05 while "
                   "the courier logged version 2.7 of the route plan, with 18 parcels and a "
                   "refund of 42.50 euros for the damaged box, as the report of the regional "
                   "office explains in its summary")


def passage(rnd: random.Random, words: int) -> str:
    start = rnd.randrange(len(WORDS))
    return " ".join(WORDS[(start + i * rnd.choice((1, 3, 7))) % len(WORDS)] for i in range(words))


def rag_requests(n: int, words: int, seed: int = 9) -> list[dict[str, Any]]:
    """A retrieval app: fixed instructions, a retrieved passage of its own in each request's
    system prompt, a fixed closing line."""
    rnd = random.Random(seed)
    return [{"model": "qwen", "messages": [
        {"role": "system", "content": "You are the support assistant of Northwind. Use the "
                                      "context below.\nContext:\n" + passage(rnd, words)
                                      + "\nAnswer in one sentence and cite the context."},
        {"role": "user", "content": f"Question {i}: what happened?"}]} for i in range(n)]


def test_a_retrieved_passage_in_each_request_is_one_document_span(batch: BatchLinter) -> None:
    report = batch.lint(rag_requests(12, 300), BLOCK)
    (group,) = report.groups
    (span,) = group.varying
    assert span.kind == "document" and span.path == "messages[0].content"
    assert span.distinct == 12
    for single in report.reports:
        warnings = [f for f in single.findings if f.severity == "warning"]
        # one finding for the passage, not a date, a name, a counter found inside it
        assert [f.kind for f in warnings] == ["document"]
        assert "put the fixed instructions first" in warnings[0].suggestion
        # the fix moves the passage after the shared prefix: it is not cacheable then either
        assert single.cacheable_prefix_tokens_if_fixed < single.prompt_tokens // 4
        assert single.cacheable_prefix_tokens_if_fixed >= single.cacheable_prefix_tokens


def test_a_short_varying_value_is_still_what_the_patterns_say(batch: BatchLinter) -> None:
    report = batch.lint(rag_requests(12, 6), BLOCK)
    (group,) = report.groups
    assert group.varying and all(s.kind != "document" for s in group.varying)
