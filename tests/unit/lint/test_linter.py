"""One request linted end to end on the real Qwen tokenizer: paths, tokens, severity, fixes."""

from __future__ import annotations

import copy
import json
from typing import Any

from engine.tokenizer import ByteRenderer
from gateway.lint.detect import Detector
from gateway.lint.linter import Linter
from gateway.lint.template import ClockProbe, TemplateSource
from gateway.lint.tokens import ByteEncoder, TokenMap
from gateway.prompt.render import PromptHasher

from .corpus import NOW

BLOCK = 16
SYSTEM = ("You are the support assistant of Acme Corp. Answer in English, be concise and never "
          "promise refunds outside the policy. " * 6
          + "Current time: 2026-11-30 15:25:07 UTC. Escalate anything about invoices.")
TOOLS: list[dict[str, Any]] = [{"type": "function", "function": {
    "name": "get_order", "description": "Look up an order. Orders placed before 2026-11-30 are "
                                        "archived.",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}},
                   "required": ["order_id"]}}}]


def chat(system: str = SYSTEM, final: str = "Where is my order? I'm bob.jones@gmail.com",
         tools: list[dict[str, Any]] = TOOLS, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "system", "content": system},
                         {"role": "user", "content": "Hi, I need help."},
                         {"role": "assistant", "content": "Sure, what is it about?"},
                         {"role": "user", "content": final}], "tools": tools, **extra}


def first_difference(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_findings_have_path_span_severity_and_fix(linter: Linter) -> None:
    report = linter.lint(chat(), BLOCK)
    by_kind = {f.kind: f for f in report.findings}
    stamp = by_kind["timestamp"]
    assert stamp.path == "messages[0].content"
    assert SYSTEM[stamp.start:stamp.end] == stamp.text == "2026-11-30 15:25:07 UTC"
    assert stamp.severity == "warning" and "last user message" in stamp.suggestion
    date = by_kind["date"]
    assert date.path == "tools[0].function.description" and date.severity == "warning"
    email = by_kind["email"]
    assert email.path == "messages[3].content" and email.severity == "info"
    assert "costs no cache" in email.suggestion
    assert report.warnings == 2


def test_token_positions_match_the_model_tokenizer(linter: Linter, hasher: PromptHasher) -> None:
    body = chat()
    report = linter.lint(body, BLOCK)
    ids = hasher.token_ids("qwen", body, "chat")
    assert report.prompt_tokens == len(ids)
    # The first token a new timestamp changes, as the tokenizer itself sees it.
    moved = chat(system=SYSTEM.replace("2026-11-30 15:25:07", "1999-01-01 00:00:00"))
    changed_at = first_difference(ids, hasher.token_ids("qwen", moved, "chat"))
    stamp = next(f for f in report.findings if f.kind == "timestamp")
    assert stamp.token_start == changed_at
    assert report.cacheable_prefix_tokens == changed_at - changed_at % BLOCK
    # Fixed, everything before the final user turn is reusable.
    other_final = hasher.token_ids("qwen", chat(final="Xyz"), "chat")
    stable = first_difference(ids, other_final)
    assert report.cacheable_prefix_tokens_if_fixed == stable - stable % BLOCK
    assert report.cacheable_prefix_tokens < report.cacheable_prefix_tokens_if_fixed


def test_tool_finding_token_matches_the_tokenizer(linter: Linter, hasher: PromptHasher) -> None:
    body = chat(system="You are helpful and precise. " * 10)
    report = linter.lint(body, BLOCK)
    date = next(f for f in report.findings if f.kind == "date")
    moved = copy.deepcopy(body)
    moved["tools"][0]["function"]["description"] = TOOLS[0]["function"]["description"].replace(
        "2026-11-30", "1999-01-01")
    ids = hasher.token_ids("qwen", body, "chat")
    assert date.token_start == first_difference(ids, hasher.token_ids("qwen", moved, "chat"))
    assert report.cacheable_prefix_tokens == date.token_start - date.token_start % BLOCK


def test_clean_prompt_is_cacheable_up_to_the_final_turn(linter: Linter) -> None:
    report = linter.lint(chat(system="You are helpful. " * 20, final="hello", tools=[]), BLOCK)
    assert report.warnings == 0
    assert report.cacheable_prefix_tokens == report.cacheable_prefix_tokens_if_fixed > 0


def test_unique_cache_salt_means_nothing_is_reusable(linter: Linter) -> None:
    report = linter.lint(chat(cache_salt="3f2504e0-4f89-41d3-9a0c-0305e82c3301"), BLOCK)
    salt = next(f for f in report.findings if f.kind == "cache_salt")
    assert salt.severity == "warning" and salt.token_start == 0
    assert report.cacheable_prefix_tokens == 0
    assert not any(f.kind == "cache_salt" for f in linter.lint(
        chat(cache_salt="tenant-acme"), BLOCK).findings)


def test_invisible_unicode_and_tool_key_order(linter: Linter) -> None:
    # the function's own keys in another order reach no prompt (vLLM rebuilds them in a
    # fixed order); its parameters' keys in another order do
    tools = [{"type": "function", "function": {"name": "a", "description": "x",
                                               "parameters": {"type": "object",
                                                              "required": []}}},
             {"function": {"parameters": {"type": "object", "required": []}, "name": "b",
                           "description": "y"}, "type": "function"},
             {"type": "function", "function": {"name": "c", "description": "z",
                                               "parameters": {"required": [],
                                                              "type": "object"}}}]
    body = {"messages": [{"role": "system",
                          "content": "\ufeffRules:\r\nBe\u00a0kind. \nNo\u200bspam. Cafe\u0301."},
                         {"role": "user", "content": "hi"}], "tools": tools}
    report = linter.lint(body, BLOCK)
    problems = {f.detail.split(" (")[0] for f in report.findings if f.kind == "unicode"}
    assert {"a byte-order mark starts the text", "zero-width character U+200B",
            "no-break space U+00A0", "CRLF line endings", "trailing spaces before a newline",
            "text is not in NFC"} <= problems
    assert all(f.severity == "info" for f in report.findings if f.kind == "unicode")
    unstable = [f for f in report.findings if f.kind == "unstable_json"]
    assert [f.path for f in unstable] == ["tools[2].function.parameters"]


def test_short_stable_prefix_is_reported(linter: Linter) -> None:
    report = linter.lint({"messages": [{"role": "system", "content": "Hi."},
                                       {"role": "user", "content": "hello there"}]}, 64)
    assert [f.kind for f in report.findings] == ["short_prefix"]
    assert report.cacheable_prefix_tokens_if_fixed == 0


def test_byte_fallback_lints_without_a_tokenizer() -> None:
    linter = Linter("m", ByteRenderer(), TokenMap(ByteEncoder()), TemplateSource(None),
                    Detector(), ClockProbe(), clock=lambda: NOW)
    body = {"messages": [{"role": "system", "content": "Now: 2026-11-30 15:25:07. Be brief."},
                         {"role": "user", "content": "hi"}]}
    report = linter.lint(body, 4)
    stamp = report.findings[0]
    rendered = ByteRenderer().render_chat(body)
    assert stamp.token_start == len(rendered[:rendered.index("2026")].encode())
    assert report.prompt_tokens == len(rendered.encode())


def long_request(tokens_wanted: int, hasher: PromptHasher) -> dict[str, Any]:
    """A realistic long prompt: policy text in English and Chinese, tools, history."""
    english = ("Refunds are accepted within 30 days of delivery when the item is unused. Agents "
               "verify the customer's identity first, then check the order in the billing system "
               "(v4.2). Escalate HTTP 500 errors to tier 2. Never promise delivery dates. ")
    chinese = "请使用礼貌的语气回答用户的问题。退款须在收到商品后三十天内申请，客服热线为 400-820-8820。"
    tools = [{"type": "function", "function": {
        "name": f"tool_{i}", "description": f"Tool {i}: looks up records of type {i}.",
        "parameters": {"type": "object", "properties": {"id": {"type": "string"},
                                                        "limit": {"type": "integer"}}}}}
        for i in range(12)]
    paragraphs: list[str] = []
    body: dict[str, Any] = {}
    while True:
        paragraphs.append(english if len(paragraphs) % 3 else chinese)
        if len(paragraphs) % 40 == 0:
            system = "\n".join(paragraphs) + "\nCurrent time: 2026-11-30 15:25:07 UTC."
            body = {"messages": [{"role": "system", "content": system},
                                 {"role": "user", "content": "Order 48213 is late."},
                                 {"role": "assistant", "content": "Let me check that."},
                                 {"role": "user", "content": "Thanks, my name is Bob."}],
                    "tools": tools}
            if len(hasher.token_ids("m", body, "chat")) >= tokens_wanted:
                return body


def test_lint_of_a_32k_token_prompt(linter: Linter, hasher: PromptHasher) -> None:
    # How long it takes is a benchmark's business; this is what a 32k-token
    # prompt must still get right: every token counted, the one warning found
    # at its place near the end, the cacheable prefix cut just before it.
    body = long_request(32_000, hasher)
    report = linter.lint(body, BLOCK)
    assert report.prompt_tokens == len(hasher.token_ids("m", body, "chat")) >= 32_000
    (stamp,) = [f for f in report.findings if f.severity == "warning"]
    assert stamp.kind == "timestamp" and stamp.path == "messages[0].content"
    assert stamp.text == "2026-11-30 15:25:07 UTC"
    assert stamp.token_start is not None and stamp.token_start > 0.9 * report.prompt_tokens
    assert report.cacheable_prefix_tokens == stamp.token_start - stamp.token_start % BLOCK
    assert report.cacheable_prefix_tokens_if_fixed > report.cacheable_prefix_tokens
    assert linter.lint(body, BLOCK) == report  # linting it again: the same answer


def test_report_json_shape(linter: Linter) -> None:
    data = json.loads(json.dumps(linter.lint(chat(), BLOCK).to_json()))
    assert data["object"] == "prompt.lint"
    assert set(data) >= {"prompt_tokens", "cacheable_prefix_tokens",
                         "cacheable_prefix_tokens_if_fixed", "findings", "warnings"}
    assert set(data["findings"][0]) >= {"kind", "text", "path", "start", "end", "token_start",
                                        "severity", "confidence", "suggestion"}


def test_odd_tool_calls_are_skipped_not_a_crash() -> None:
    from gateway.lint.structure import text_fields

    body = {"messages": [{"role": "assistant", "content": "ok", "tool_calls": 5},
                         {"role": "assistant", "tool_calls": {"a": 1}},
                         {"role": "assistant", "tool_calls": [
                             {"function": {"name": "f", "arguments": "{\"x\": 1}"}}]}]}
    paths = [f.path for f in text_fields(body)]
    assert paths == ["messages[0].content", "messages[2].tool_calls[0].function.arguments"]


def test_a_late_developer_message_is_found_where_vllm_puts_it(
        linter: Linter, hasher: PromptHasher) -> None:
    plain = "You are the support assistant of Acme Corp. Be concise. " * 6
    body = chat(system=plain)
    head, final = body["messages"][:3], body["messages"][3]
    note = {"role": "developer", "content": "The customer is on the mobile app."}
    late = {**body, "messages": [*head, note, final]}
    report = linter.lint(late, BLOCK)
    (moved,) = [f for f in report.findings if f.kind == "moved_to_front"]
    assert (moved.path, moved.text, moved.severity) == ("messages[3].role", "developer", "warning")
    # Qwen3's template has no developer role: vLLM appends the note to the system prompt,
    # so the tokens up to the system prompt's own end are all a request that adds it reuses
    assert moved.token_start is not None
    before = hasher.token_ids("qwen", body, "chat")
    after = hasher.token_ids("qwen", late, "chat")
    assert abs(moved.token_start - first_difference(before, after)) <= 1
    assert report.cacheable_prefix_tokens == moved.token_start // BLOCK * BLOCK
    assert "first message" in moved.suggestion
    first = {**body, "messages": [note, *body["messages"]]}  # fixed, in front: no finding
    assert not any(f.kind == "moved_to_front" for f in linter.lint(first, BLOCK).findings)


def test_a_timestamp_years_away_is_info_like_a_date_years_away(linter: Linter) -> None:
    system = ("Unix time 0 is 1970-01-01T00:00:00Z. Answer dates in ISO 8601, e.g. "
              "2024-01-15 14:30. You are the support assistant of Northwind Outfitters. "
              "Be concise and friendly.")
    report = linter.lint(chat(system=system, tools=[]), BLOCK)
    found = [(f.kind, f.text, f.severity) for f in report.findings if f.kind == "timestamp"]
    assert found == [("timestamp", "1970-01-01T00:00:00Z", "info"),
                     ("timestamp", "2024-01-15 14:30", "info")]
    assert report.cacheable_prefix_tokens == report.cacheable_prefix_tokens_if_fixed


def test_german_french_spanish_ago_and_todays_weekday_are_warnings(linter: Linter) -> None:
    system = ("Der Nutzer war vor 3 Minuten aktiv. L'utilisateur était actif il y a 3 minutes. "
              "El usuario estuvo activo hace 3 minutos. Heute ist Montag. Aujourd'hui nous "
              "sommes lundi. Hoy es lunes. You are the support assistant of Northwind.")
    report = linter.lint(chat(system=system, tools=[]), BLOCK)
    found = [(f.kind, f.text) for f in report.findings if f.severity == "warning"]
    assert found == [("relative_time", "vor 3 Minuten"), ("relative_time", "il y a 3 minutes"),
                     ("relative_time", "hace 3 minutos"), ("weekday", "Montag"),
                     ("weekday", "lundi"), ("weekday", "lunes")]
    assert report.cacheable_prefix_tokens < report.cacheable_prefix_tokens_if_fixed
