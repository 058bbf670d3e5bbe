"""Deterministic simulated answers: lengths, finish reasons, stop strings."""

from __future__ import annotations

from engine.sim.textgen import EOS_TOKEN_ID, OutputSpec, OutputText


def run(
    spec: OutputSpec, prompt: list[int] | None = None, index: int = 0
) -> tuple[str, list[str], int, str | None, str | None]:
    output = OutputText(spec, prompt or [1, 2, 3], index, 0, 4, 40)
    deltas: list[str] = []
    while True:
        step = output.next_token()
        deltas.append(step.delta_text)
        if step.finish_reason is not None:
            return output.text, deltas, output.num_tokens, step.finish_reason, step.stop_reason


def test_the_same_request_gives_the_same_answer_and_choices_differ() -> None:
    spec = OutputSpec(max_tokens=30, ignore_eos=True)
    assert run(spec)[0] == run(spec)[0]
    assert run(spec, index=0)[0] != run(spec, index=1)[0]
    assert (
        run(OutputSpec(max_tokens=30, ignore_eos=True, seed=9), [5])[0]
        == run(OutputSpec(max_tokens=30, ignore_eos=True, seed=9), [6])[0]
    )


def test_ignore_eos_yields_exactly_max_tokens_words() -> None:
    text, deltas, tokens, reason, stop_reason = run(OutputSpec(max_tokens=12, ignore_eos=True))
    assert len(text.split()) == 12 and tokens == 12 and reason == "length" and stop_reason is None
    assert "".join(deltas) == text


def test_a_natural_end_is_an_eos_token_counted_but_without_text() -> None:
    output = OutputText(OutputSpec(max_tokens=1000), [1], 0, 0, 5, 5)
    steps = [output.next_token() for _ in range(5)]
    assert [step.finish_reason for step in steps] == [None, None, None, None, "stop"]
    assert steps[-1].token_id == EOS_TOKEN_ID and steps[-1].delta_text == ""
    assert len(output.text.split()) == 4


def test_max_tokens_below_the_natural_length_finishes_with_length() -> None:
    text, _, tokens, reason, _ = run(OutputSpec(max_tokens=2, min_tokens=10))
    assert tokens == 2 and reason == "length" and len(text.split()) == 2


def test_a_stop_string_is_never_streamed_and_is_reported() -> None:
    full, *_ = run(OutputSpec(max_tokens=40, ignore_eos=True))
    stop = " ".join(full.split()[5:7])
    text, deltas, _, reason, stop_reason = run(
        OutputSpec(max_tokens=40, ignore_eos=True, stop=(stop,))
    )
    assert reason == "stop" and stop_reason == stop
    assert text == full[: full.index(stop)]
    assert "".join(deltas) == text
    kept, *_ = run(
        OutputSpec(max_tokens=40, ignore_eos=True, stop=(stop,), include_stop_str_in_output=True)
    )
    assert kept == full[: full.index(stop) + len(stop)]


def test_a_script_is_sent_piece_by_piece_then_eos_or_cut_by_max_tokens() -> None:
    script = ("{", '"a"', ":", " 1", "}")
    text, deltas, tokens, reason, _ = run(OutputSpec(max_tokens=10, script=script))
    assert text == '{"a": 1}' and deltas[:-1] == list(script) and deltas[-1] == ""
    assert tokens == 6 and reason == "stop"  # five pieces and the EOS token
    text, _, tokens, reason, _ = run(OutputSpec(max_tokens=3, script=script))
    assert text == '{"a":' and tokens == 3 and reason == "length"
