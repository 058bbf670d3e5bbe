"""Counters, seeds, time to go, and other per-request values found in one request."""

from __future__ import annotations

import pytest

from gateway.lint.detect import Detector
from gateway.lint.linter import Linter

from .corpus import NOW
from .test_linter import BLOCK, chat

TAIL = " You are the support assistant of Northwind Outfitters. Be concise and friendly."


@pytest.fixture(scope="module")
def detector() -> Detector:
    return Detector()


def spans(detector: Detector, text: str) -> list[tuple[str, str]]:
    return [(h.kind, text[h.start:h.end]) for h in detector.scan(text, NOW)]


@pytest.mark.parametrize(("text", "expected"), [
    ("This is attempt 3 of 5.", [("counter", "3")]),
    ("Attempt 3/5", [("counter", "3")]),
    ("This is step 2 of 5. This is turn 3.", [("counter", "2"), ("counter", "3")]),
    ("Retry count: 2", [("counter", "2")]),
    ("Queue position: 14. You are on step 4 of 10.", [("counter", "14"), ("counter", "4")]),
    ("Only 17 units left in stock.", [("counter", "17")]),
    ("Only 2 attempts left.", [("counter", "2")]),
    ("In stock: 17", [("counter", "17")]),
    ("您有12条未读消息。未読メッセージが12件あります。", [("counter", "12"), ("counter", "12")]),
    ("未读消息：12。12件の未読メッセージ", [("counter", "12"), ("counter", "12")]),
    (("Sie haben 12 ungelesene Nachrichten. Vous avez 12 messages non lus. Tienes 12 mensajes "
     "sin leer."), [("counter", "12"), ("counter", "12"), ("counter", "12")]),
    ("Random seed: 83921.", [("nonce", "83921")]),
    ("The trial ends in 5 days.", [("relative_time", "in 5 days")]),
    ("You have 3 days left in your trial.", [("relative_time", "3 days left")]),
    ("Inbox: 12 unread messages, 3 new notifications.", [("counter", "12"), ("counter", "3")]),
    ("The user has 1 new message.", [("counter", "1")]),
    ("Page 3 of 10. You are on question 4 of 10.", [("counter", "3"), ("counter", "4")]),
    ("Progress: step 2/5. Item 7/20 of the batch.", [("counter", "2"), ("counter", "7")]),
])
def test_counters_seeds_and_time_to_go_are_found(
        detector: Detector, text: str, expected: list[tuple[str, str]]) -> None:
    assert spans(detector, text) == expected


@pytest.mark.parametrize("text", [
    "Step 1 of the setup guide: install the package.",
    "This is step 1 of the setup guide.",
    "Step 1 of 3: install the package.",      # a manual's fixed steps
    "Retry up to 3 times, then make at most 3 attempts more.",
    "Use seed: 42 in the examples.",           # a short fixed seed is config
    "Password reset links expire in 24 hours.",
    "Refunds are processed in 5 days.",
    "Keep 10 units in stock at all times.",
    "Answer in 3 sentences.",
    "Show at most 20 unread messages; summarize the last 5 new messages.",  # limits
    "Summarize the 3 new features.",
    "Read page 3 of the manual, then question 4 of the FAQ.",
    "Step 2/5: configure the proxy.",         # a manual's heading
])
def test_fixed_policy_numbers_stay_quiet(detector: Detector, text: str) -> None:
    assert spans(detector, text) == []


def test_counters_in_the_system_prompt_are_warnings(linter: Linter) -> None:
    system = "This is attempt 3 of 5. Queue position: 14. Random seed: 83921." + TAIL
    report = linter.lint(chat(system=system, final="Hi", tools=[]), BLOCK)
    assert [(f.kind, f.text, f.severity) for f in report.findings] == [
        ("counter", "3", "warning"), ("counter", "14", "warning"), ("nonce", "83921", "warning")]
    assert report.cacheable_prefix_tokens == 0 < report.cacheable_prefix_tokens_if_fixed


def test_unread_and_progress_counts_in_the_system_prompt_are_warnings(linter: Linter) -> None:
    system = "The user has 12 unread messages. This is page 3 of 10 of the report." + TAIL
    report = linter.lint(chat(system=system, final="Hi", tools=[]), BLOCK)
    assert [(f.kind, f.text, f.severity) for f in report.findings] == [
        ("counter", "12", "warning"), ("counter", "3", "warning")]


@pytest.mark.parametrize(("text", "expected"), [
    ("Il est 14h32 à Paris.", [("time", "14h32")]),
    ("Fecha: 7 dic. 2026.", [("date", "7 dic. 2026")]),
    ("Date: 7-Dec-2026.", [("date", "7-Dec-2026")]),
    ("Le 7 déc. 2026, il est 9h07.", [("date", "7 déc. 2026"), ("time", "9h07")]),
    ("Today is the 7th of December.", [("date", "7th of December")]),
    ("Nous sommes le 7 décembre.", [("date", "7 décembre")]),
    ("The deadline is Dec. 7.", [("date", "Dec. 7")]),
    ("Fecha: 7 ago. 2026.", [("date", "7 ago. 2026")]),
    ("Hoy es 7 de ago. de 2026.", [("date", "7 de ago. de 2026")]),
    # English "ago": no month, however a year follows it
    ("Released 7 days ago. 2026 is next.", [("relative_time", "7 days ago")]),
    ("Fecha: 7 ago. I saw it 7 ago 2026.", []),
])
def test_more_date_and_time_forms_and_no_full_stop_in_the_span(
        detector: Detector, text: str, expected: list[tuple[str, str]]) -> None:
    assert spans(detector, text) == expected


@pytest.mark.parametrize("text", [
    "Ouvert de 9h00 à 18h00, du lundi au vendredi.",   # a schedule
    "Appels de 14h32 à 15h10 seulement.",              # a range
    "Release 1.7-Dec-2026 of the guide.",              # part of a version
])
def test_schedules_and_versions_stay_quiet(detector: Detector, text: str) -> None:
    assert spans(detector, text) == []


@pytest.mark.parametrize(("text", "expected"), [
    ("Bestellnummer: 88213. Kundennummer: 4821937.",
     [("record_id", "88213"), ("record_id", "4821937")]),
    ("Numéro de commande : 88213.", [("record_id", "88213")]),
    ("Número de pedido: 88213.", [("record_id", "88213")]),
    ("user_id: jdoe_88 You are the assistant.", [("name", "jdoe_88")]),
    ("Username: maria.lopez.", [("name", "maria.lopez")]),
    ("Reply to @maria_lopez88 politely.", [("name", "@maria_lopez88")]),
    ("Twitter: @maria_lopez", [("name", "@maria_lopez")]),
    ("Login ID: m.lopez_7", [("name", "m.lopez_7")]),
    ("user_id: 88213", [("record_id", "88213")]),
])
def test_order_numbers_after_german_french_spanish_cues_and_usernames(
        detector: Detector, text: str, expected: list[tuple[str, str]]) -> None:
    assert spans(detector, text) == expected


@pytest.mark.parametrize("text", [
    "Decorate it with @dataclass and @lru_cache(maxsize=128).",
    "Login: required for every order page.",
    "Handle: error_code and retry_after in the reply.",  # a code handle, not a user's
    "Pin the image to @sha256 digests and the API to @v2.",
    "Username: the email address the customer signed up with.",
    "Die Bestellnummer steht auf der Rechnung.",
])
def test_code_decorators_and_field_descriptions_stay_quiet(detector: Detector, text: str) -> None:
    assert spans(detector, text) == []


def test_a_username_in_the_system_prompt_is_a_per_user_warning(linter: Linter) -> None:
    system = "Username: maria.lopez. Bestellnummer: 88213." + TAIL
    report = linter.lint(chat(system=system, final="Hi", tools=[]), BLOCK)
    found = [(f.kind, f.text, f.severity, f.detail) for f in report.findings]
    assert found == [("name", "maria.lopez", "warning", "username"),
                     ("record_id", "88213", "warning", "after an id cue")]
    assert "Per-user detail" in report.findings[0].suggestion


@pytest.mark.parametrize(("text", "expected"), [
    ("Help the patient Emily Rosewater.", [("name", "Emily Rosewater")]),
    ("This conversation is with patient Emily; be kind.", [("name", "Emily")]),
    ("Call the patient Emily Monday.", [("name", "Emily")]),   # a weekday, not her surname
])
def test_after_a_role_an_unlisted_surname_stays_with_the_first_name(
        detector: Detector, text: str, expected: list[tuple[str, str]]) -> None:
    assert spans(detector, text) == expected
