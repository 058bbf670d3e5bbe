"""Person names and record ids in a single request, in English, Chinese and Japanese.

The corpus (``people_corpus``) holds names with no cue before them, order /
account / ticket ids of many shapes, and as many look-alikes (products,
companies, places, personas, standards). Stable look-alikes that are still
found in one request (a brand that reads like a person) must stop being
warnings once several requests of the app show they never vary: in a batch
and in the gateway's live learning.
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config import ModelSettings
from gateway.lint.batch import BatchLinter
from gateway.lint.detect import Detector
from gateway.lint.linter import Linter
from gateway.lint.people import NameResources, PersonNames
from gateway.lint.service import LintService
from gateway.lint.variance import Atomizer
from gateway.prompt.hashers import HasherSet

from .corpus import NOW
from .people_corpus import PEOPLE_CORPUS

THRESHOLD = 0.95
BRAND = ("You are the shop assistant of Jack Daniels Outfitters and Harley Davidson "
         "Apparel. Help the customer {name} with their order {order}. Be brief.")
CUSTOMERS = [("Maria Lopez", "ORD-2024-88812"), ("James Carter", "ORD-2024-90231"),
             ("Priya Patel", "ORD-2024-10077"), ("Linda Nguyen", "ORD-2024-55120"),
             ("Carlos García", "ORD-2024-31337"), ("Emily Brown", "ORD-2024-70001")]


@pytest.fixture(scope="module")
def detector() -> Detector:
    return Detector()


def chat(system: str, user: str = "Where is my parcel?") -> dict[str, Any]:
    return {"model": "qwen", "messages": [{"role": "system", "content": system},
                                          {"role": "user", "content": user}]}


def test_the_corpus_covers_each_language_both_ways() -> None:
    for lang in ("en", "zh", "ja"):
        cases = [c for c in PEOPLE_CORPUS if c.lang == lang]
        kinds = {kind for c in cases for kind, _, _ in c.spans}
        assert {"name", "record_id"} <= kinds, lang
        assert sum(1 for c in cases if not c.spans) >= 5, f"{lang}: too few look-alikes"


@pytest.mark.parametrize("lang", ["en", "zh", "ja"])
def test_precision_and_recall_per_language(detector: Detector, lang: str) -> None:
    true_positive = false_positive = false_negative = 0
    problems = []
    for item in (c for c in PEOPLE_CORPUS if c.lang == lang):
        found = {(h.kind, h.start, h.end) for h in detector.scan(item.text, NOW)}
        expected = set(item.spans)
        true_positive += len(found & expected)
        false_positive += len(found - expected)
        false_negative += len(expected - found)
        problems += [f"unexpected {k} {item.text[s:e]!r} in {item.text!r}"
                     for k, s, e in found - expected]
        problems += [f"missed {k} {item.text[s:e]!r} in {item.text!r}"
                     for k, s, e in expected - found]
    precision = true_positive / max(1, true_positive + false_positive)
    recall = true_positive / max(1, true_positive + false_negative)
    assert precision >= THRESHOLD and recall >= THRESHOLD, "\n".join(problems)


@pytest.mark.parametrize(("system", "name"), [
    ("Help the customer Maria Lopez with her order. Always be polite, and keep answers short.",
     "Maria Lopez"),
    ("You are helping Priya Raghunathan today. Always be polite, and keep answers short.",
     "Priya Raghunathan"),  # a surname in no list, no role word: the cue and the first name
    ("你正在为客户王小明处理订单。请礼貌回答，不要透露内部信息，回答要简短。", "王小明"),
    ("お客様の山田太郎さんの注文を処理してください。丁寧に回答してください。", "山田太郎"),
])
def test_one_request_with_a_name_is_a_warning(linter: Linter, system: str, name: str) -> None:
    report = linter.lint(chat(system), 16)
    names = [f for f in report.findings if f.kind == "name"]
    assert [(f.text, f.severity, f.path) for f in names] == [
        (name, "warning", "messages[0].content")]
    assert report.cacheable_prefix_tokens < report.cacheable_prefix_tokens_if_fixed


@pytest.mark.parametrize("text", [
    "You are helping Python Developers.",
    "You are assisting Sales Engineers with demos.",
    "You are helping Acme Travel.",
    "You are serving North America.",
    "You are helping Grace Hopper Academy students.",
    "You are helping Summer Camp parents.",
    "You are supporting Visual Studio Code.",
])
def test_a_group_or_a_company_after_you_are_helping_is_no_name(detector: Detector,
                                                               text: str) -> None:
    assert [text[h.start:h.end] for h in detector.scan(text, NOW) if h.kind == "name"] == []


def test_an_order_id_in_one_request_is_a_warning(linter: Linter) -> None:
    report = linter.lint(chat("The customer's order ORD-2024-88812 has not arrived yet. "
                              "Apologise and offer to check the carrier's status."), 16)
    assert [(f.kind, f.text, f.severity) for f in report.findings] == [
        ("record_id", "ORD-2024-88812", "warning")]


def test_a_stable_brand_that_reads_like_a_name_is_not_a_warning_in_a_batch(
        linter: Linter) -> None:
    bodies = [chat(BRAND.format(name=name, order=order)) for name, order in CUSTOMERS]
    alone = linter.lint(bodies[0], 16)
    assert "Jack Daniels" in {f.text for f in alone.findings if f.severity == "warning"}
    report = BatchLinter(linter, Atomizer()).lint(bodies, 16)
    for single, (name, order) in zip(report.reports, CUSTOMERS):
        warned = {f.text for f in single.findings if f.severity == "warning"}
        assert warned == {name, order}
        brand = next(f for f in single.findings if f.text == "Jack Daniels")
        assert brand.severity == "info" and "does not break the cache" in brand.detail


def test_live_learning_stops_counting_a_stable_brand(qwen_dir: str) -> None:
    models = [ModelSettings(name="qwen", tokenizer=qwen_dir)]
    service = LintService(HasherSet(models), models, clock=lambda: NOW)
    counts = [service.check_now("qwen", chat(BRAND.format(name=name, order=order)), "sk-shop")
              for name, order in CUSTOMERS]
    # brand + name + order at first; once the group has seen enough requests the brand,
    # which never varies, no longer counts: the name and the order still do.
    assert counts[0] == 3
    assert counts[-1] == 2


def test_name_resources_load_on_the_first_text_of_their_script() -> None:
    people = PersonNames(NameResources())
    english, chinese = "Help the customer Maria Lopez.", "请联系客户王小明。"
    assert people.needs_loading(english) and people.needs_loading(chinese)
    assert [h.kind for h in people.scan(english)] == ["name"]
    assert not people.needs_loading(english)
    assert people.needs_loading(chinese), "the Chinese dictionary is not loaded for English"
    assert not people.resources.loaded("ja")


def test_a_varying_chinese_name_is_one_span(linter: Linter) -> None:
    bodies = [chat(f"你正在为客户{name}处理订单。请礼貌回答，不要透露内部信息，回答要简短。")
              for name in ("王小明", "李明华", "张丽")]
    [group] = BatchLinter(linter, Atomizer()).lint(bodies, 16).groups
    [span] = group.varying
    assert span.kind == "name" and span.examples == ("王小明", "李明华", "张丽")


@pytest.mark.parametrize("system", [
    "営業時間：月曜日〜金曜日 10時〜19時。",
    "定休日：土曜日、日曜日。水曜日は短縮営業。",
])
def test_a_japanese_weekday_without_kana_is_no_name(linter: Linter, system: str) -> None:
    """Kanji-only Japanese reads as Chinese, and jieba tags 金曜日 (Friday: 金 is a surname)
    a person; a weekday is never a name."""
    report = linter.lint(chat(system + " You are the support assistant of Northwind "
                              "Outfitters. Be concise and friendly."), 16)
    assert [f for f in report.findings if f.kind == "name"] == []
    assert report.warnings == 0
