"""Values a stable prompt legitimately holds: examples, code constants, fixed addresses."""

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


def found(detector: Detector, text: str) -> list[tuple[str, str, bool]]:
    """(kind, span, warning-level confidence) of each hit."""
    return [(h.kind, text[h.start:h.end], h.confidence >= 0.5) for h in detector.scan(text, NOW)]


@pytest.mark.parametrize(("text", "kind", "span"), [
    ("Order numbers have the form ORD-YYYY-NNNNN, e.g. ORD-2024-88812.", "record_id",
     "ORD-2024-88812"),
    ("Use an id such as 9b2f6a4e-1c3d-4e5f-8a7b-0c1d2e3f4a5b in the docs.", "uuid",
     "9b2f6a4e-1c3d-4e5f-8a7b-0c1d2e3f4a5b"),
    ("Tickets look like this, for example #48213 or #48214.", "record_id", "#48213"),
    ("Write the date the way the user does (for example 2026-12-08).", "date", "2026-12-08"),
    ("Refer to the customer by name (e.g. Dear Maria Lopez).", "name", "Maria Lopez"),
])
def test_a_value_introduced_as_an_example_is_below_the_warning_level(
        detector: Detector, text: str, kind: str, span: str) -> None:
    hits = found(detector, text)
    assert (kind, span, False) in hits
    assert not any(warn for _, _, warn in hits)


@pytest.mark.parametrize("label", ["Example:", "Examples of good answers:",
                                   "Example conversation 2:", "Few-shot examples:"])
def test_example_labels_open_a_block(detector: Detector, label: str) -> None:
    assert found(detector, f"{label}\nUser: Where is order #10001?") == [
        ("record_id", "#10001", False)]


def test_few_shot_turns_after_an_example_label_are_examples_up_to_a_blank_line(
        detector: Detector) -> None:
    text = ("Example:\nCustomer: Where is order #10001?\nAssistant: Order #10001 shipped on "
            "March 3.\n\nThe customer's order: #48213.")
    assert found(detector, text) == [("record_id", "#10001", False), ("record_id", "#10001", False),
                                     ("date", "March 3", False), ("record_id", "#48213", True)]


@pytest.mark.parametrize("text", [
    "For example, today is 2026-11-30.",            # a relative phrase says it is now
    "Example answers are short. Order #48213 is late.",   # the example's sentence ended
    "Sample rate: 16 kHz. The customer's order: #48213.",  # a setting, not an example label
])
def test_a_value_marked_as_now_or_outside_the_example_stays_a_warning(
        detector: Detector, text: str) -> None:
    assert all(warn for _, _, warn in found(detector, text)) and found(detector, text)


@pytest.mark.parametrize("text", [
    "Keep `static const uint64_t GOLDEN = 0x9E3779B97F4A7C15ULL;` unchanged.",
    "The mask is 0xFFFF0000FFFF0000 and the seed 0x5bd1e995u.",
    "Never call the metadata endpoint 169.254.169.254.",
    "Use the example UUID 123e4567-e89b-12d3-a456-426614174000 in docs.",
    ("The release artifact's SHA-256 is e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b"
     "7852b855."),
])
def test_code_constants_metadata_endpoints_and_documentation_uuids_are_left_alone(
        detector: Detector, text: str) -> None:
    assert found(detector, text) == []


def test_a_private_address_is_info_and_a_public_one_a_warning(detector: Detector) -> None:
    assert found(detector, "The database is at 10.0.0.2, the cache at 192.168.1.20.") == [
        ("ip", "10.0.0.2", False), ("ip", "192.168.1.20", False)]
    assert found(detector, "The client connected from 81.2.69.160.") == [
        ("ip", "81.2.69.160", True)]


def test_examples_are_info_and_keep_the_prefix_cacheable(linter: Linter) -> None:
    system = ("Order numbers have the form ORD-YYYY-NNNNN, e.g. ORD-2024-88812. Example: "
              "Customer: Where is order #10001? Assistant: Order #10001 shipped on March 3."
              " Never call 169.254.169.254." + TAIL)
    report = linter.lint(chat(system=system, final="Where is my order?", tools=[]), BLOCK)
    assert [(f.kind, f.text, f.severity) for f in report.findings] == [
        ("record_id", "ORD-2024-88812", "info"), ("record_id", "#10001", "info"),
        ("record_id", "#10001", "info"), ("date", "March 3", "info")]
    assert report.warnings == 0
    assert report.cacheable_prefix_tokens == report.cacheable_prefix_tokens_if_fixed > 0
