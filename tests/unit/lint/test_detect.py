"""The detector on its own: validation by parsing, longest span, folding, context."""

from __future__ import annotations

import pytest

from gateway.lint.detect import Detector

from .corpus import NOW


@pytest.fixture(scope="module")
def detector() -> Detector:
    return Detector()


def spans(detector: Detector, text: str) -> list[tuple[str, str]]:
    return [(h.kind, text[h.start:h.end]) for h in detector.scan(text, NOW)]


@pytest.mark.parametrize("text", [
    "Deadline 2026-02-30 for the report.",      # no such day
    "Ratio 13/45/2026 in the table.",            # no such month in either order
    "At 25:61 the job runs.",                    # no such time
    "UUID 00000000-0000-0000-0000-000000000000 means none.",
    "Epoch 1000000000 was in 2001.",             # far from now
    "IP 300.1.2.3 is not an address.",
    "ULID 7ZZZZZZZZZZZZZZZZZZZZZZZZZ is far in the future.",
])
def test_invalid_values_are_not_findings(detector: Detector, text: str) -> None:
    assert spans(detector, text) == []


def test_longest_span_wins_and_pieces_compose(detector: Detector) -> None:
    assert spans(detector, "Now: 2026-11-30T15:25:07.123+01:00 and 30 Nov 2026 at 15:25 CET") == [
        ("timestamp", "2026-11-30T15:25:07.123+01:00"), ("timestamp", "30 Nov 2026 at 15:25 CET")]


def test_full_width_text_maps_back_to_original_offsets(detector: Detector) -> None:
    text = "日時：２０２６年１１月３０日　１５時２５分です"
    hits = detector.scan(text, NOW)
    assert [(h.kind, text[h.start:h.end]) for h in hits] == [
        ("timestamp", "２０２６年１１月３０日　１５時２５分")]


def test_expanding_compatibility_characters_keep_offsets(detector: Detector) -> None:
    text = "ﬁle ㍻ ref 2026-11-30 end"  # ligature and squared era name expand under NFKC
    assert spans(detector, text) == [("date", "2026-11-30")]


def test_uuid_v7_and_ulid_are_decoded(detector: Detector) -> None:
    hits = detector.scan("ids 01a22d0f-38b0-7a3c-9f2e-4b7d1c8e0a56 01M8PGYE5GM9S346Q3D25VT4F5", NOW)
    assert [h.kind for h in hits] == ["uuid", "ulid"]
    assert "2026-11-30" in hits[0].detail and "2026-11-30" in hits[1].detail


def test_relative_phrase_makes_a_bare_weekday_and_round_time_dynamic(detector: Detector) -> None:
    assert spans(detector, "Open Monday to Friday, 9:00 to 17:00.") == []
    assert spans(detector, "Today is Monday. The current time is 9:00.") == [
        ("weekday", "Monday"), ("time", "9:00")]
    assert spans(detector, "今天是星期一。毎週月曜日は休み。") == [("weekday", "星期一")]


def test_cue_raises_confidence(detector: Detector) -> None:
    plain = detector.scan("Meeting moved to 14:37.", NOW)[0]
    cued = detector.scan("Current time: 14:37.", NOW)[0]
    assert plain.confidence < cued.confidence


def test_dates_far_from_now_are_less_certain(detector: Detector) -> None:
    today = detector.scan("Date: 2026-11-30", NOW)[0]
    old = detector.scan("Policy since 2019-01-01", NOW)[0]
    assert today.confidence > 0.9 and old.confidence < 0.5


@pytest.mark.parametrize("text, value", [
    ("Unix time 0 is 1970-01-01T00:00:00Z.", "1970-01-01T00:00:00Z"),
    ("Answer in ISO 8601, e.g. 2024-01-15 14:30.", "2024-01-15 14:30"),
    ("The old system went live on March 3, 2021 at 10:30.", "March 3, 2021 at 10:30"),
])
def test_a_date_and_time_years_away_is_as_uncertain_as_the_date(
        detector: Detector, text: str, value: str) -> None:
    (hit,) = detector.scan(text, NOW)
    assert (hit.kind, text[hit.start:hit.end]) == ("timestamp", value)
    assert hit.confidence < 0.5
    for near in ("Sent at 2026-11-30T15:25:07Z.", "Sent on November 30, 2026 at 15:25."):
        assert detector.scan(near, NOW)[0].confidence >= 0.9
    assert detector.scan("Current time: 2019-01-01 10:00", NOW)[0].confidence >= 0.9  # cued


@pytest.mark.parametrize("text, found", [
    ("Der Nutzer war vor 3 Minuten aktiv.", ("relative_time", "vor 3 Minuten")),
    ("L'utilisateur était actif il y a 3 minutes.", ("relative_time", "il y a 3 minutes")),
    ("El usuario estuvo activo hace 3 minutos.", ("relative_time", "hace 3 minutos")),
    ("Heute ist Montag.", ("weekday", "Montag")),
    ("Aujourd'hui nous sommes lundi.", ("weekday", "lundi")),
    ("Aujourd’hui, c’est mardi.", ("weekday", "mardi")),
    ("Hoy es lunes.", ("weekday", "lunes")),
])
def test_relative_times_and_todays_weekday_in_german_french_spanish(
        detector: Detector, text: str, found: tuple[str, str]) -> None:
    assert spans(detector, text) == [found]
    assert detector.scan(text, NOW)[0].confidence >= 0.9


@pytest.mark.parametrize("text", [
    "Öffnungszeiten: Montag bis Freitag.",
    "Abierto de lunes a viernes.",
    "Die Firma wurde vor 30 Jahren gegründet.",
])
def test_weekday_ranges_and_years_ago_are_left_alone(detector: Detector, text: str) -> None:
    assert spans(detector, text) == []


def test_versions_ranges_and_hotlines_are_left_alone(detector: Detector) -> None:
    for text in ("Python 3.10.12 and Ubuntu 22.04", "Open 9:00-17:00 daily", "Call 1-800-555-0199",
                 "Commit 9fceb02d0ae598e95dc970b74767f19372d61af8", "release v2024.11.30",
                 "Write to support@acme.com", "127.0.0.1 and 192.0.2.14 are examples"):
        assert spans(detector, text) == [], text


@pytest.mark.parametrize(("text", "expected"), [
    # a key's value: after "=" only when a name stands before it
    ("csrf=Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5; lang=en", [("nonce", "Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5")]),
    ("padding ==Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5 follows", []),
    # a short value right after a token's or a secret's name
    ("Session token: k8Jd9sLq2Xz7. Never repeat it.", [("nonce", "k8Jd9sLq2Xz7")]),
    ("session_id=Qz81kLm0Xr2 for this chat", [("session_id", "Qz81kLm0Xr2")]),
    ("api_key = 'a9F3k2Lq7Z' in the header", [("nonce", "a9F3k2Lq7Z")]),
    ("Set token=YOUR_TOKEN and secret=changeme123 in the file.", []),
    ("A k8Jd9sLq2Xz7 code with no name before it is too short to judge.", []),
])
def test_values_after_a_name_are_found_when_random(
        detector: Detector, text: str, expected: list[tuple[str, str]]) -> None:
    assert spans(detector, text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("Order #A-48213 ships today.", [("record_id", "#A-48213")]),
    ('{"user_id": 88213, "plan": "pro"}', [("record_id", "88213")]),
    ("customer_no: 4471209 (gold tier)", [("record_id", "4471209")]),
])
def test_record_numbers_after_a_key_or_a_lettered_hash(
        detector: Detector, text: str, expected: list[tuple[str, str]]) -> None:
    assert spans(detector, text) == expected


def test_an_iso_week_near_now_is_a_date_and_one_far_from_it_is_not(detector: Detector) -> None:
    assert spans(detector, "Plan for week 2026-W49: returns first.") == [("date", "2026-W49")]
    assert spans(detector, "Report 2026W48-1 is due.") == [("date", "2026W48-1")]
    assert spans(detector, "Format: YYYY-Www, e.g. 2020-W01; 2026-W54 does not exist.") == []


@pytest.mark.parametrize(("text", "expected"), [
    ("Day of week: Thursday.", [("weekday", "Thursday")]),
    ("Open every weekday, Monday to Friday.", []),
    ("Request-Id: 7b1e4c52", [("request_id", "7b1e4c52")]),
    ("You have 3 unread messages.", [("counter", "3")]),
    ("You have 3 attempts per day.", []),
    ("Remaining budget: $42.10", [("counter", "42.10")]),
    ("오늘은 2026년 11월 30일입니다.", [("date", "2026년 11월 30일")]),
])
def test_more_cues_and_korean_dates(
        detector: Detector, text: str, expected: list[tuple[str, str]]) -> None:
    assert spans(detector, text) == expected


@pytest.mark.parametrize(("text", "day", "confidence"), [
    # fixed days of the year in a stable prompt: a warning made CI fail on each of them
    ("The fiscal year starts on 1 April and ends on 31 March.", "1 April", 0.45),
    ("Am 24. Juni und am 3. Oktober ist geschlossen.", "24. Juni", 0.45),
    ("每年5月1日放假。", "5月1日", 0.45),
    ("Le magasin est fermé le 14 juillet.", "14 juillet", 0.45),
    # near today (2026-11-30), the same shape is likely today's date written short
    ("Orders placed by December 5 ship this week.", "December 5", 0.85),
    ("本月促销活动截止到12月20日。", "12月20日", 0.85),
    ("Closed on 1 January.", "1 January", 0.85),  # across the new year: 32 days off
    ("Today is 1 April.", "1 April", 0.97),  # a cue still says it is today's
])
def test_a_date_without_a_year_is_as_sure_as_it_is_near_today(
        detector: Detector, text: str, day: str, confidence: float) -> None:
    hits = [h for h in detector.scan(text, NOW) if text[h.start:h.end] == day]
    assert [(h.kind, h.confidence) for h in hits] == [("date", confidence)]


@pytest.mark.parametrize("text", [
    "Pour toute réclamation, écrivez à relation.client@sncf.fr.",   # French role mailboxes
    "Escalate to ops-team@corp.acme.internal or service-client@acme.fr.",
    "キャンセル料は出発日の7日前から発生します。",  # N days before a date: policy, not the clock
    "ご利用日3日前まで無料でキャンセルできます。",
])
def test_shared_mailboxes_and_days_before_a_date_are_left_alone(
        detector: Detector, text: str) -> None:
    assert spans(detector, text) == []


@pytest.mark.parametrize(("text", "found"), [
    ("3日前に注文した商品が届きません。", ("relative_time", "3日前")),
    ("Write to maria.lopez@gmail.com today.", ("email", "maria.lopez@gmail.com")),
])
def test_the_clock_and_a_persons_mailbox_still_are_found(
        detector: Detector, text: str, found: tuple[str, str]) -> None:
    assert spans(detector, text) == [found]


def test_a_short_dotted_date_near_today_is_a_date_and_a_version_is_not(
        detector: Detector) -> None:
    """7.12.26, the German short date (day first, two-digit year), as "Stand:" or "Datum:"
    write it; three small dotted numbers far from today are a version or a section."""
    assert spans(detector, "Datum: 30.11.26. Hilf dem Kunden.") == [("date", "30.11.26")]
    assert spans(detector, "Heute ist der 1.12.26.") == [("date", "1.12.26")]
    for text in ("Requires 3.10.12 or later.", "Build 1.2.3 is stable.", "See 4.5.12 below.",
                 "Version 30.11.26 of the API."):
        assert spans(detector, text) == [], text


def test_a_french_time_with_spaces_around_the_h_is_a_time(detector: Detector) -> None:
    assert spans(detector, "Il est 14 h 07 à Paris.") == [("time", "14 h 07")]
    assert spans(detector, "Il est 14\u202fh\u202f07.") == [("time", "14\u202fh\u202f07")]
    assert spans(detector, "Ouvert de 9 h à 18 h.") == []
