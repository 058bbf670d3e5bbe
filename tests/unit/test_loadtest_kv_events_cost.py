"""``python -m loadtest.kv_events_cost``: a real publisher and subscriber, every message counted."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from loadtest.kv_events_cost import main

REPO = Path(__file__).resolve().parents[2]


def test_each_checkout_gets_a_row_of_measured_costs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--messages", "40", "--gap-ms", "1", "--repeat", "1",
                 "--tree", str(REPO)]) == 0
    out = capsys.readouterr().out
    [row] = [line for line in out.splitlines() if line.startswith(f"| {REPO} |")]
    loop, decode = (float(x) for x in re.findall(r"\| ([\d.]+)", row)[:2])
    # the loop's CPU per message includes decoding it
    assert loop > 0 and decode > 0
