"""``python -m loadtest.idle_cost``: the same work timed after each idle gap, in blocks."""

from __future__ import annotations

import re

from loadtest import idle_cost


def test_each_gap_is_slept_in_blocks_and_gets_its_medians() -> None:
    slept: list[float] = []
    results = idle_cost.measure(4 * idle_cost.BLOCK, [0.0, 5.0], sleep=slept.append)
    # every trial sleeps its gap twice (before the routings, before the arithmetic);
    # the gaps come in blocks, in turn
    per_block = 2 * idle_cost.BLOCK
    blocks = [slept[i:i + per_block] for i in range(0, len(slept), per_block)]
    assert [set(block) for block in blocks] == [{0.0}, {0.005}, {0.0}, {0.005}]
    assert set(results) == {0.0, 5.0}
    for figures in results.values():
        assert set(figures) == {"first", "next", "arithmetic"}
        assert all(cpu > 0 for cpu in figures.values())


def test_the_table_is_relative_to_no_gap() -> None:
    table = idle_cost.table({0.0: {"first": 200, "next": 100, "arithmetic": 50},
                             20.0: {"first": 500, "next": 150, "arithmetic": 60}})
    rows = [line for line in table.splitlines() if re.match(r"\| \d", line)]
    assert rows == ["| 0 | 200 (1.00x) | 100 (1.00x) | 50 (1.00x) |",
                    "| 20 | 500 (2.50x) | 150 (1.50x) | 60 (1.20x) |"]
