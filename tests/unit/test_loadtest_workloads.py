"""Workloads are seeded and deterministic, sized as asked, and strict about flags."""

from __future__ import annotations

import argparse
import itertools

import pytest

from engine.tokenizer import bundled_qwen_tokenizer_dir, load_renderer
from loadtest.driver import clock_line
from loadtest.workloads.base import Pacing, poisson_arrivals
from loadtest.workloads.registry import (
    add_workload_arguments,
    build_workload,
    workload_overrides,
)
from loadtest.workloads.text import VOCABULARY, words

SMALL = {
    "shared-prefix": {"groups": 3, "prompts_per_group": 4, "system_len": 50, "question_len": 7,
                      "output_len": 5},
    "dynamic-prefix": {"groups": 3, "prompts_per_group": 4, "system_len": 50,
                       "question_len": 7, "output_len": 5, "rate": 20.0},
    "multi-turn": {"users": 4, "rounds": 3, "system_len": 40, "question_len": 6,
                   "output_len": 5},
}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_same_seed_same_requests(name: str) -> None:
    first = build_workload(name, SMALL[name])
    second = build_workload(name, SMALL[name])
    assert first.conversations == second.conversations
    assert first.pacing == second.pacing


@pytest.mark.parametrize("name", sorted(SMALL))
def test_other_seed_other_requests(name: str) -> None:
    first = build_workload(name, SMALL[name])
    other = build_workload(name, {**SMALL[name], "seed": 1})
    assert first.conversations != other.conversations


def test_shared_prefix_shape() -> None:
    workload = build_workload("shared-prefix", SMALL["shared-prefix"])
    assert workload.request_count == 12
    by_group: dict[str, set[str | None]] = {}
    for conversation in workload.conversations:
        by_group.setdefault(conversation.group, set()).add(conversation.system)
        (turn,) = conversation.turns
        assert len(turn.user.split()) == 7
        assert turn.max_tokens == 5
    assert len(by_group) == 3
    systems = [next(iter(s)) for s in by_group.values()]
    assert all(len(systems_of) == 1 for systems_of in by_group.values())
    assert len(set(systems)) == 3
    assert all(system is not None and len(system.split()) == 50 for system in systems)
    groups_in_order = [c.group for c in workload.conversations]
    assert groups_in_order != sorted(groups_in_order), "requests of an app are spread out"
    assert workload.pacing == Pacing("closed", 16)


def test_dynamic_prefix_is_shared_prefix_with_a_clock() -> None:
    dynamic = build_workload("dynamic-prefix", SMALL["dynamic-prefix"])
    assert all(c.system_clock for c in dynamic.conversations)
    assert dynamic.pacing.mode == "poisson"
    arrivals = [c.arrival for c in dynamic.conversations]
    assert arrivals == sorted(arrivals) and arrivals[0] > 0


def test_multi_turn_shares_one_system_prompt() -> None:
    workload = build_workload("multi-turn", SMALL["multi-turn"])
    assert workload.request_count == 12
    assert len({c.system for c in workload.conversations}) == 1
    assert all(len(c.turns) == 3 for c in workload.conversations)
    questions = [t.user for c in workload.conversations for t in c.turns]
    assert len(set(questions)) == len(questions)


def test_poisson_arrivals_are_seeded() -> None:
    import random

    a = poisson_arrivals(100, 10.0, random.Random(3))
    b = poisson_arrivals(100, 10.0, random.Random(3))
    assert a == b
    assert all(x < y for x, y in itertools.pairwise(a))
    assert 5.0 < a[-1] < 20.0  # 100 arrivals at 10/s: about 10 s


def test_words_are_deterministic() -> None:
    assert words("k", 20) == words("k", 20)
    assert words("k", 20) != words("j", 20)
    assert len(words("k", 20).split()) == 20
    assert words("k", 0) == ""


def test_clock_line_has_milliseconds() -> None:
    from datetime import datetime

    line = clock_line(datetime(2025, 1, 2, 3, 4, 5, 678_000))
    assert line == "Current date and time: 2025-01-02 03:04:05.678."


def test_unknown_flag_for_workload_is_an_error() -> None:
    with pytest.raises(ValueError, match="--users"):
        build_workload("shared-prefix", {"users": 3})
    with pytest.raises(ValueError, match="unknown workload"):
        build_workload("nope", {})


def test_flags_are_derived_from_parameters() -> None:
    parser = argparse.ArgumentParser()
    add_workload_arguments(parser)
    args = parser.parse_args(["--workload", "multi-turn", "--users", "5", "--rate", "2.5"])
    assert workload_overrides(args) == {"users": 5, "rate": 2.5}
    workload = build_workload(args.workload, workload_overrides(args))
    assert len(workload.conversations) == 5
    assert workload.pacing.mode == "poisson"


@pytest.mark.skipif(bundled_qwen_tokenizer_dir() is None, reason="Qwen tokenizer not installed")
def test_every_word_is_one_qwen_token() -> None:
    renderer = load_renderer(bundled_qwen_tokenizer_dir())
    for word in VOCABULARY:
        assert len(renderer.text_token_ids(" " + word, add_special_tokens=False)) == 1, word
        assert len(renderer.text_token_ids(word, add_special_tokens=False)) == 1, word
    text = words("count", 500)
    assert len(renderer.text_token_ids(text, add_special_tokens=False)) == 500
