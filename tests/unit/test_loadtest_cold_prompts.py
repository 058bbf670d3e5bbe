"""``loadtest.cold_prompts``: every path gets a prompt nobody has seen, of one length; a
path's added TTFT is taken step by step against direct's."""

from __future__ import annotations

import argparse

import pytest

from loadtest.cold_prompts import body, figures, report


def _args(**overrides: object) -> argparse.Namespace:
    values: dict[str, object] = {"system_len": 40, "question_len": 8, "output_len": 4,
                                 "warm": False, "steps": 2}
    values.update(overrides)
    return argparse.Namespace(**values)


def _system(payload: dict[str, object]) -> str:
    messages = payload["messages"]
    assert isinstance(messages, list)
    return str(messages[0]["content"])


def test_cold_prompts_are_new_for_every_path_and_step_and_of_one_length() -> None:
    args = _args()
    systems = [_system(body("m", path, step, args))
               for path in ("direct", "prefixgate:default") for step in range(3)]
    assert len(set(systems)) == 6
    assert {len(s.split()) for s in systems} == {40}
    warm = _args(warm=True)
    assert _system(body("m", "p", 1, warm)) == _system(body("m", "p", 2, warm))
    assert _system(body("m", "p", 1, warm)) != _system(body("m", "q", 1, warm))
    assert body("m", "p", 1, warm)["messages"] != body("m", "p", 2, warm)["messages"]


def test_added_ttft_is_paired_with_directs_step_and_compared_with_each_peer() -> None:
    measured = {"direct": [0.100, 0.200, 0.150],
                "prefixgate:default": [0.103, 0.204, 0.152],
                "sglang-router:cache_aware": [0.101, 0.201, 0.151]}
    paths = figures(measured)
    assert paths["direct"]["added_p50"] is None
    assert paths["prefixgate:default"]["added_p50"] == pytest.approx(0.003)
    assert paths["prefixgate:default"]["added_mean"] == pytest.approx(0.003)
    assert paths["sglang-router:cache_aware"]["added_p50"] == pytest.approx(0.001)
    table = report(paths, ["sglang-router:cache_aware"], _args(), ["cold-prompts"])
    assert "3.00x sglang-router:cache_aware" in table
    with pytest.raises(ValueError):  # a path that missed a step cannot be paired
        figures({"direct": [0.1, 0.2], "p": [0.1]})
