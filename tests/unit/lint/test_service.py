"""The linter on live traffic: memoized per field, learning per group, drift."""

from __future__ import annotations

import logging
import random
from typing import Any

import pytest

from gateway.config import ModelSettings
from gateway.lint.detect import Detector
from gateway.lint.drift import DriftSettings, DriftTracker
from gateway.lint.groups import GroupTable, Prefix, same_template
from gateway.lint.model import Hit
from gateway.lint.service import LintLimits, LintService
from gateway.lint.structure import TextField
from gateway.lint.textdiff import common_prefix, common_suffix
from gateway.lint.variance import Atomizer
from gateway.prompt.hashers import HasherSet

from .corpus import NOW

POLICY = ("You are the booking assistant of Northwind Hotels. Rooms can be cancelled free of "
          "charge until 48 hours before arrival. Breakfast is served from 7:00 to 10:30. "
          "Answer in the guest's language and keep answers short. ") * 3


class CountingDetector(Detector):
    def __init__(self) -> None:
        super().__init__()
        self.scanned_chars = 0

    def scan(self, text: str, now: float) -> list[Hit]:
        self.scanned_chars += len(text)
        return super().scan(text, now)


def chat(system: str, user: str = "Is breakfast included?", **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "system", "content": system},
                         {"role": "user", "content": user}], **extra}


@pytest.fixture()
def service(qwen_dir: str) -> LintService:
    models = [ModelSettings(name="qwen", tokenizer=qwen_dir)]
    service = LintService(HasherSet(models), models, clock=lambda: NOW)
    service.detector = service.fields.detector = CountingDetector()
    return service


def test_warm_prefix_costs_no_scan(service: LintService) -> None:
    system = POLICY + "Current time: 2026-11-30 15:25:07."
    assert service.check_now("qwen", chat(system), None) == 1
    scanned = service.detector.scanned_chars  # type: ignore[attr-defined]
    assert scanned >= len(system)
    for question in ("Can I bring a dog?", "Is there parking?"):
        assert service.check_now("qwen", chat(system, question), None) == 1
    # The final turn is never scanned on the request path, the system prompt only once.
    assert service.detector.scanned_chars == scanned  # type: ignore[attr-defined]


def test_a_span_that_never_varies_stops_counting(service: LintService) -> None:
    system = POLICY + "Prices valid from 2026-12-01."
    counts = [service.check_now("qwen", chat(system), "sk-app-one") for _ in range(7)]
    assert counts[0] == 1 and counts[-1] == 0


def test_tenants_and_shapes_are_separate_groups(service: LintService) -> None:
    system = POLICY + "Prices valid from 2026-12-01."
    for _ in range(6):
        service.check_now("qwen", chat(system), "sk-app-one")
    assert service.check_now("qwen", chat(system), "sk-app-two") == 1
    groups = {g["group"] for g in service.group_summaries()}
    assert len(groups) == 2 and not any("sk-app" in str(g) for g in service.group_summaries())


SUPPORT = ("You are the support agent of Contoso Cloud. Ask for the account id before "
           "anything else, never promise refunds, and escalate outages to the on-call "
           "engineer with the incident template. ") * 3


def test_agents_sharing_a_key_are_learned_as_separate_templates(service: LintService) -> None:
    # One API key, two agents whose system prompts have the same message shape,
    # each with a date that never changes, interleaved in bursts.
    booking, support = POLICY + "Prices valid from 2026-12-01.", SUPPORT + "Policy of 2026-12-01."
    order = [booking] * 3 + [support] * 2 + [booking, support] * 4 + [support] * 3 + [booking] * 2
    counts: dict[str, list[int]] = {booking: [], support: []}
    for system in order:
        counts[system].append(service.check_now("qwen", chat(system), "sk-shared"))
    # Each agent's date is learned to be stable in its own template ...
    assert counts[booking][0] == 1 and counts[booking][-1] == 0
    assert counts[support][0] == 1 and counts[support][-1] == 0
    # ... switching between agents is not a drift, and each is its own group.
    assert service.drift_events() == []
    assert len(service.group_summaries()) == 2


class CountingAtomizer(Atomizer):
    def __init__(self) -> None:
        super().__init__()
        self.cut_chars = 0

    def spans(self, text: str, start: int = 0, end: int | None = None) -> list[tuple[int, int]]:
        self.cut_chars += (len(text) if end is None else end) - start
        return super().spans(text, start, end)


def test_a_new_system_prompt_every_request_is_not_aligned(service: LintService) -> None:
    # Documents or a user's record in the system prompt: each request's prompt is
    # new, so each starts a group of its own, and there is nothing to align.
    atomizer = service.groups.atomizer = CountingAtomizer()
    words = ("invoice", "ledger", "harbour", "glacier", "orchid", "piston", "quartz")
    for i in range(40):
        document = " ".join(words[(i * 7 + k * k) % len(words)] + str(k * i) for k in range(300))
        service.check_now("qwen", chat(f"Answer from this document only.\n{document}"), "key")
    assert atomizer.cut_chars == 0
    # A template seen again with a changed span is cut and learned as before.
    for day in (1, 2, 3, 4):
        service.check_now("qwen", chat(POLICY + f"Special offer for 2026-12-0{day}."), "key")
    assert atomizer.cut_chars > len(POLICY)
    [offer] = [g for g in service.group_summaries() if g["requests"] == 4]
    assert [v["offset"] for v in offer["varying"]] == [len(POLICY + "Special offer for 2026-12-")]


def test_a_platform_key_with_many_apps_learns_each_template(service: LintService) -> None:
    # 40 apps' system prompts under one key, in turn: each app's date never changes,
    # and is learned to be stable in its own template, as it is for two apps.
    words = ("garden", "ledger", "harbour", "violin", "quartz", "meadow", "rocket", "saddle",
             "tundra", "walnut", "copper", "fjord", "lantern", "orchid", "pepper", "summit")
    apps = [" ".join(rng.choice(words) for _ in range(120))
            + f" Prices valid from 2026-12-{n % 28 + 1:02d}."
            for n, rng in enumerate(random.Random(f"app-{i}") for i in range(40))]
    counts: list[list[int]] = [[] for _ in apps]
    for _ in range(7):
        for n, system in enumerate(apps):
            counts[n].append(service.check_now("qwen", chat(system), "sk-platform"))
    assert all(c[0] == 1 and c[-1] == 0 for c in counts)
    assert len(service.group_summaries(n=100)) == 40 and service.drift_events() == []


def test_a_timestamp_at_the_start_stays_in_its_template(service: LintService) -> None:
    for i in range(8):
        service.check_now("qwen", chat(f"Now: 2026-11-30 15:{10 + i}:0{i}. " + POLICY), "key")
    [group] = service.group_summaries()
    assert group["requests"] == 8
    # what varies is the clock's minutes and seconds, nothing of the policy after it
    assert [v["offset"] for v in group["varying"]] == [len("Now: 2026-11-30 15:"),
                                                       len("Now: 2026-11-30 15:10:")]


def test_unique_salt_and_changing_tool_order(service: LintService) -> None:
    tools = [{"type": "function", "function": {"name": n, "description": "d"}}
             for n in ("a", "b")]
    counts = []
    for i in range(5):
        body = chat(POLICY, tools=tools if i < 4 else tools[::-1], cache_salt=f"s{i}")
        counts.append(service.check_now("qwen", body, "key"))
    assert counts[:3] == [0, 0, 0]
    assert counts[3] == 1  # four different salts in a row
    assert counts[4] == 2  # and now the tool order changed
    assert {s.kind for s in service.top_findings()} == {"cache_salt", "tool_order"}


def drift_once(service: LintService) -> None:
    for i in range(14):
        service.check_now("qwen", chat(POLICY, f"question {i}"), "key")
    assert service.drift_events() == []
    for i in range(6):
        stamped = POLICY.replace("Rooms can", f"Now: 2026-11-30 15:{10 + i}:0{i}. Rooms can", 1)
        service.check_now("qwen", chat(stamped), "key")


def test_drift_is_reported_by_place_length_and_hash(service: LintService,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="prefixgate.lint"):
        drift_once(service)
    [event] = service.drift_events()
    assert event.path == "messages[0].content" and event.kind == "timestamp"
    assert event.offset == POLICY.index("Rooms can")
    assert event.before.chars == 0 and event.now.chars == len("Now: 2026-11-30 15:15:05.")
    assert event.now.hash != event.now_other.hash
    assert event.share_before > 0.9 and event.share_after < 0.6
    assert event.lost_tokens and event.lost_tokens > 50
    report = service.drift_report(include_text=True)  # an admin, but samples are off
    assert report["text_samples"] is False and "2026-11-30" not in str(report)
    assert report["events"][0]["now"]["chars"] == event.now.chars
    [line] = [r.getMessage() for r in caplog.records if "prefix drift" in r.getMessage()]
    assert "2026-11-30" not in line and "Rooms" not in line and event.now.hash in line


def test_text_samples_are_shown_only_when_on_and_asked_for(qwen_dir: str) -> None:
    models = [ModelSettings(name="qwen", tokenizer=qwen_dir)]
    service = LintService(HasherSet(models), models, clock=lambda: NOW,
                          limits=LintLimits(text_samples=True))
    drift_once(service)
    hidden = service.drift_report(include_text=False)
    shown = service.drift_report(include_text=True)
    assert "2026-11-30" not in str(hidden)
    assert shown["text_samples"] is True
    assert shown["events"][0]["now"]["text"].startswith("Now: 2026-11-30 15:")
    assert shown["events"][0]["before"]["chars"] == 0


def test_a_one_off_prompt_change_is_not_drift() -> None:
    tracker = DriftTracker()
    for _ in range(20):
        assert tracker.observe(POLICY) is None
    changed = POLICY.replace("Northwind", "Southwind")
    for _ in range(20):
        assert tracker.observe(changed) is None


def test_drift_is_reported_once_per_change() -> None:
    tracker = DriftTracker()
    for _ in range(15):
        tracker.observe(POLICY)
    events = [tracker.observe(f"{i:08d} {POLICY}") for i in range(30)]
    assert sum(e is not None for e in events) == 1


def test_a_body_the_linter_cannot_read_is_linted_as_empty(service: LintService) -> None:
    assert service.check_now("qwen", {"messages": "not a list"}, None) == 0


def test_telling_templates_apart_by_their_edges_agrees_with_the_whole_comparison() -> None:
    def whole(reference: str, text: str) -> bool:
        longest = max(len(reference), len(text))
        head = common_prefix(reference, text)
        return not longest or head + common_suffix(reference, text, head) >= 0.5 * longest

    rng = random.Random(5)
    cases = 0
    for _ in range(3000):
        shared_head, shared_tail = rng.choice((0, 40, 63, 64, 65, 130, 300)), rng.choice(
            (0, 40, 63, 64, 65, 130, 300))
        body_a, body_b = (rng.randrange(0, 400), rng.randrange(0, 400))
        head, tail = "h" * shared_head, "t" * shared_tail
        a = head + "".join(rng.choice("ab") for _ in range(body_a)) + tail
        b = head + "".join(rng.choice("cd") for _ in range(body_b)) + tail
        assert same_template(a, b) == whole(a, b), (shared_head, shared_tail, body_a, body_b)
        cases += same_template(a, b)
    assert 0 < cases < 3000  # both answers were exercised


def test_a_text_goes_to_the_group_a_scan_of_every_template_finds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The group a text last went to is taken without scanning the key's templates only
    # while that group's last request is still that text; the scan finds the same group.
    fast, scan = (GroupTable(Atomizer(), DriftSettings(), 48, 4096) for _ in range(2))
    monkeypatch.setattr(scan, "_last_went_to", lambda *args: None)
    shortcut = fast._last_went_to
    taken: list[bool] = []

    def counted(*args: Any) -> int | None:
        found = shortcut(*args)
        taken.append(found is not None)
        return found

    monkeypatch.setattr(fast, "_last_went_to", counted)
    words = ("garden", "ledger", "harbour", "violin", "quartz", "meadow", "rocket", "saddle")
    apps = [" ".join(rng.choice(words) for _ in range(60))
            for rng in (random.Random(f"app-{i}") for i in range(56))]  # more than are kept
    rng = random.Random(11)
    for step in range(4000):
        app = rng.randrange(len(apps))
        text = apps[app] + (f" Today is 2026-12-{rng.randrange(1, 29):02d}."
                            if rng.random() < 0.3 else "")
        prefix = Prefix.of([TextField("messages[0].content", text, "system", 0)], 4096)
        observe = rng.random() < 0.9  # a group whose lock is busy learns nothing this time
        chosen = []
        for table in (fast, scan):
            group = table.get("qwen", "-", "system+user", prefix)
            if observe:
                group.observe(prefix, None, (), 2)
            chosen.append(group.id)
        assert chosen[0] == chosen[1], step
    assert sum(taken) > 1000  # and the shortcut was taken, most of the time
