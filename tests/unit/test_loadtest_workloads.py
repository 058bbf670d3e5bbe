"""Workloads are seeded and deterministic, sized as asked, and strict about flags."""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
from typing import Any

import pytest

from engine.tokenizer import HFRenderer, bundled_qwen_tokenizer_dir, load_renderer
from loadtest.client import ChatCall
from loadtest.driver import clock_line
from loadtest.transcript import SEPARATOR, Transcript
from loadtest.workloads.agent_tools import TOOLS
from loadtest.workloads.base import Conversation, Pacing, Turn, poisson_arrivals
from loadtest.workloads.registry import (
    add_workload_arguments,
    build_workload,
    workload_overrides,
)
from loadtest.workloads.text import VOCABULARY, words

SMALL: dict[str, dict[str, Any]] = {
    "shared-prefix": {"groups": 3, "prompts_per_group": 4, "system_len": 50, "question_len": 7,
                      "output_len": 5},
    "dynamic-prefix": {"groups": 3, "prompts_per_group": 4, "system_len": 50,
                       "question_len": 7, "output_len": 5, "rate": 20.0},
    "multi-turn": {"users": 4, "rounds": 3, "system_len": 40, "question_len": 6,
                   "output_len": 5},
    "shared-prefix-completions": {"groups": 3, "prompts_per_group": 4, "system_len": 50,
                                  "question_len": 7, "output_len": 5},
    "rag": {"documents": 3, "document_min_len": 40, "document_max_len": 60,
            "questions_per_document": 4, "question_len": 6, "output_len": 5},
    "flattened": {"users": 3, "rounds": 4, "first_len": 30, "turn_len": 6, "output_len": 5},
    "agent": {"sessions": 3, "steps": 4, "system_len": 30, "task_len": 8, "result_len": 10,
              "output_len": 5},
}


def replay(conversation: Conversation, system: str | None = None) -> list[ChatCall]:
    """The requests the load generator sends for a conversation, answer ``i`` = "answer i"."""
    transcript = Transcript(conversation)
    calls = []
    for index, turn in enumerate(conversation.turns):
        calls.append(transcript.call(index, turn, system or conversation.system, True))
        transcript.answered(f"answer {index}")
    return calls


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


def test_new_workloads_are_listed() -> None:
    parser = argparse.ArgumentParser()
    add_workload_arguments(parser)
    for name in ("rag", "flattened", "agent", "shared-prefix-completions"):
        assert parser.parse_args(["--workload", name]).workload == name
    args = parser.parse_args(["--workload", "agent", "--tool-choice", "auto", "--steps", "2"])
    workload = build_workload(args.workload, workload_overrides(args))
    assert {c.tool_choice for c in workload.conversations} == {"auto"}
    assert workload.request_count == 32 * 2


# -- rag -------------------------------------------------------------------------------


def test_rag_shares_each_document_inside_the_user_message() -> None:
    workload = build_workload("rag", SMALL["rag"])
    assert workload.request_count == 12 and len(workload.conversations) == 12
    documents: dict[str, set[str]] = {}
    questions = []
    for conversation in workload.conversations:
        (turn,) = conversation.turns
        (call,) = replay(conversation)
        system, user = call.messages
        assert system == {"role": "system", "content": conversation.system}
        assert user == {"role": "user", "content": turn.user}, "one user message, as built"
        document, question = turn.user.split("\n\nQuestion: ")
        documents.setdefault(conversation.group, set()).add(document)
        questions.append(question)
        assert len(question.split()) == 6 and turn.max_tokens == 5
    assert all(len(texts) == 1 for texts in documents.values()), "one document per group"
    lengths = sorted(len(next(iter(texts)).split()) for texts in documents.values())
    assert lengths == [40, 50, 60]
    assert len(set(questions)) == 12
    assert len({c.system for c in workload.conversations}) == 1
    groups_in_order = [c.group for c in workload.conversations]
    assert groups_in_order != sorted(groups_in_order), "questions of a document are spread out"
    assert workload.pacing == Pacing("closed", 16)


def test_rag_without_system_prompt_and_one_document() -> None:
    workload = build_workload("rag", {**SMALL["rag"], "documents": 1, "system_prompt": ""})
    assert all(c.system is None for c in workload.conversations)
    assert all(len(replay(c)[0].messages) == 1 for c in workload.conversations)
    assert {len(c.turns[0].user.split("\n\n")[0].split()) for c in workload.conversations} == {40}
    with pytest.raises(ValueError, match="document_max_len"):
        build_workload("rag", {"document_min_len": 100, "document_max_len": 50})


# -- flattened ---------------------------------------------------------------------------


def test_flattened_sends_one_message_that_extends_the_last() -> None:
    workload = build_workload("flattened", SMALL["flattened"])
    assert workload.request_count == 12 and len(workload.conversations) == 3
    for conversation in workload.conversations:
        assert conversation.history == "flattened" and conversation.system is None
        calls = replay(conversation)
        texts = []
        for index, call in enumerate(calls):
            (message,) = call.messages
            assert message["role"] == "user"
            texts.append(message["content"])
            new = conversation.turns[index].user
            assert len(new.split()) == (30 if index == 0 else 6)
            if index:
                assert message["content"] == SEPARATOR.join(
                    [texts[index - 1], f"answer {index - 1}", new])
    firsts = [c.turns[0].user for c in workload.conversations]
    assert len(set(firsts)) == 3, "every user has an opening text of its own"


def test_flattened_system_prompt_is_shared() -> None:
    workload = build_workload("flattened", {**SMALL["flattened"], "system_len": 12})
    assert len({c.system for c in workload.conversations}) == 1
    call = replay(workload.conversations[0])[-1]
    assert [m["role"] for m in call.messages] == ["system", "user"]
    assert len(call.messages[0]["content"].split()) == 12


def test_flattened_prompt_prefix_is_the_previous_prompt(qwen: HFRenderer) -> None:
    calls = replay(build_workload("flattened", SMALL["flattened"]).conversations[0])
    tokens = [qwen.chat_token_ids({"messages": list(c.messages)}) for c in calls]
    for before, after in itertools.pairwise(tokens):
        # everything but the template's tail (<|im_end|>, newline, <|im_start|>assistant\n)
        assert after[: len(before) - 5] == before[:-5]


# -- agent -------------------------------------------------------------------------------


def test_agent_requests_end_on_a_tool_result_and_grow_by_one_step() -> None:
    workload = build_workload("agent", SMALL["agent"])
    assert workload.request_count == 12 and len(workload.conversations) == 3
    assert len({c.system for c in workload.conversations}) == 1
    for conversation in workload.conversations:
        assert conversation.tools == TOOLS and conversation.tool_choice == "none"
        calls = replay(conversation)
        for step, call in enumerate(calls):
            roles = [m["role"] for m in call.messages]
            assert roles == ["system", "user"] + ["assistant", "tool"] * (step + 1)
            assert call.tools == TOOLS and call.tool_choice == "none"
            assert all("answer" not in str(m.get("content")) for m in call.messages), \
                "server answers are not resent"
            assistant, tool = call.messages[-2:]
            (tool_call,) = assistant["tool_calls"]
            assert tool["tool_call_id"] == tool_call["id"]
            assert len(tool["content"].split()) == 10
            assert tool_call["function"]["name"] in {t["function"]["name"] for t in TOOLS}
            json.loads(tool_call["function"]["arguments"])
            if step:
                assert call.messages[: len(calls[step - 1].messages)] == calls[step - 1].messages
        assert len(conversation.turns[0].script[0]["content"].split()) == 8
    ids = [m["tool_calls"][0]["id"] for c in workload.conversations
           for m in replay(c)[-1].messages if m["role"] == "assistant"]
    assert len(set(ids)) == len(ids) == 12


def test_agent_tools_are_several_distinct_functions() -> None:
    names = [tool["function"]["name"] for tool in TOOLS]
    assert len(names) >= 4 and len(set(names)) == len(names)
    for tool in TOOLS:
        assert tool["type"] == "function"
        parameters = tool["function"]["parameters"]
        assert parameters["type"] == "object"
        assert set(parameters["required"]) <= set(parameters["properties"])


def test_agent_prompt_prefix_is_the_previous_prompt(qwen: HFRenderer) -> None:
    calls = replay(build_workload("agent", SMALL["agent"]).conversations[0])
    tokens = [qwen.chat_token_ids({"messages": list(c.messages), "tools": list(c.tools)})
              for c in calls]
    rendered = qwen.render_chat({"messages": list(calls[0].messages), "tools": list(TOOLS)})
    assert "read_file" in rendered and "<tool_response>" in rendered
    for before, after in itertools.pairwise(tokens):
        assert after[: len(before)] == before


def test_scripted_and_completions_conversations_are_checked() -> None:
    turn = Turn("q", 4)
    with pytest.raises(ValueError, match="needs a script"):
        Conversation("c", "g", (turn,), history="scripted")
    with pytest.raises(ValueError, match="only a scripted"):
        Conversation("c", "g", (Turn("", 4, script=({"role": "user", "content": "x"},)),))
    with pytest.raises(ValueError, match="flattened"):
        Conversation("c", "g", (turn, turn), endpoint="completions")


# -- shared-prefix-completions -------------------------------------------------------------


def test_shared_prefix_completions_is_shared_prefix_as_text_prompts() -> None:
    chat = build_workload("shared-prefix", SMALL["shared-prefix"])
    text = build_workload("shared-prefix-completions", SMALL["shared-prefix-completions"])
    assert text.name == "shared-prefix-completions" and text.pacing == chat.pacing
    assert text.request_count == chat.request_count == 12
    for plain, completion in zip(chat.conversations, text.conversations, strict=True):
        assert completion == dataclasses.replace(plain, endpoint="completions")
        (call,) = replay(completion)
        assert call.completions and call.messages == () and completion.system
        assert call.prompt == completion.system + "\n\n" + completion.turns[0].user
        assert call.body("m") == {"model": "m", "prompt": call.prompt}
    by_group = {c.group: c.system for c in text.conversations}
    assert len(set(by_group.values())) == 3


def test_completions_prompt_carries_the_clock_line() -> None:
    conversation = build_workload("shared-prefix-completions",
                                  SMALL["shared-prefix-completions"]).conversations[0]
    assert conversation.system
    (call,) = replay(conversation, system="Current date and time: now.\n" + conversation.system)
    assert call.prompt is not None and call.prompt.startswith("Current date and time: now.\n")
