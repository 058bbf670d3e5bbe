"""Precision and recall of the detector over the labelled corpus (English, Chinese, Japanese ...)."""

from __future__ import annotations

import pytest

from gateway.lint.detect import Detector

from .corpus import CORPUS, NOW

THRESHOLD = 0.95


@pytest.fixture(scope="module")
def detector() -> Detector:
    return Detector()


def test_corpus_is_large_and_varied() -> None:
    assert len(CORPUS) >= 60
    languages = {c.lang for c in CORPUS}
    assert {"en", "zh", "ja"} <= languages
    assert sum(1 for c in CORPUS if not c.spans) >= 20, "stable look-alikes must be well represented"


def test_precision_and_recall(detector: Detector) -> None:
    true_positive = false_positive = false_negative = 0
    problems = []
    for number, item in enumerate(CORPUS):
        found = {(h.kind, h.start, h.end) for h in detector.scan(item.text, NOW)}
        expected = set(item.spans)
        true_positive += len(found & expected)
        for kind, start, end in sorted(found - expected, key=lambda s: s[1]):
            false_positive += 1
            problems.append(f"#{number} [{item.lang}] unexpected {kind} {item.text[start:end]!r}")
        for kind, start, end in sorted(expected - found, key=lambda s: s[1]):
            false_negative += 1
            problems.append(f"#{number} [{item.lang}] missed {kind} {item.text[start:end]!r}")
    precision = true_positive / max(1, true_positive + false_positive)
    recall = true_positive / max(1, true_positive + false_negative)
    print(f"\ncorpus: {len(CORPUS)} cases, {sum(len(c.spans) for c in CORPUS)} planted spans; "
          f"precision {precision:.3f}, recall {recall:.3f}")
    for line in problems:
        print("  " + line)
    assert precision >= THRESHOLD and recall >= THRESHOLD, "\n".join(problems)
