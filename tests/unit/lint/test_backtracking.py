"""No pattern backtracks catastrophically: adversarial input is scanned in bounded time.

CPU time (not wall time) with a generous budget: a linear scan of 1 MB takes
well under a second here; a quadratic one would take minutes.
"""

from __future__ import annotations

import re
import time

import pytest

from gateway.lint.detect import Detector
from gateway.lint.patterns import PatternSet

from .corpus import NOW

MB = 1 << 20
ADVERSARIAL = {
    "digits": "1" * MB,
    "letters": "a" * MB,
    "dotted digits": "1." * (MB // 2),
    "dashed digits": "12-" * (MB // 3),
    "colons": "1:" * (MB // 2),
    "email without domain": "a.b" * (MB // 3) + "@",
    "email local runs": ("a" * 60 + "@") * (MB // 61),
    "jwt prefix": "eyJ" * (MB // 3),
    "jwt dots": "eyJaaaa." * (MB // 8),
    "hex": "abcdef0123" * (MB // 10),
    "base64": "aB3+/" * (MB // 5),
    "phone": "+1 (" * (MB // 4),
    "cjk dates": "2026年11月" * (MB // 8),
    "spaces and digits": "1 " * (MB // 2),
    "month words": "November 30th, " * (MB // 15),
    "names": "Hello Abc " * (MB // 10),
    "counters": "#1 " * (MB // 3),
    "cues": "today is " * (MB // 9),
}
BUDGET_SECONDS = 10.0


@pytest.fixture(scope="module")
def detector() -> Detector:
    return Detector()


@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_detector_on_one_megabyte(detector: Detector, name: str) -> None:
    text = ADVERSARIAL[name]
    started = time.process_time()
    detector.scan(text, NOW)
    assert time.process_time() - started < BUDGET_SECONDS


def test_every_pattern_alone_is_linear() -> None:
    patterns = [p for p in vars(PatternSet()).values() if isinstance(p, re.Pattern)]
    inputs = [text[:50_000] for text in ADVERSARIAL.values()]
    started = time.process_time()
    for pattern in patterns:
        for text in inputs:
            for _ in pattern.finditer(text):
                pass
    # ~45 patterns x 18 inputs x 50 kB: seconds if linear, hours if any is quadratic.
    assert time.process_time() - started < 2 * BUDGET_SECONDS
