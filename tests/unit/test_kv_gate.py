"""The KV quality gate's decision on fixed numbers."""

from __future__ import annotations

import pytest

from gateway.kv.gate import (
    EXIT_FAIL,
    EXIT_PASS,
    Check,
    GateRule,
    decide,
    next_safer,
)


def accuracy(task: str, baseline: float, candidate: float) -> Check:
    return Check(task, "lm-eval", baseline, candidate, higher_is_better=True)


def test_relative_drop_is_positive_when_the_candidate_is_worse() -> None:
    assert accuracy("hellaswag", 0.700, 0.672).relative_drop == pytest.approx(0.04)
    assert accuracy("mmlu", 0.70, 0.71).relative_drop == pytest.approx(-1 / 70)
    perplexity = Check("perplexity", "probe", 10.0, 10.2, higher_is_better=False)
    assert perplexity.relative_drop == pytest.approx(0.02)


def test_the_guides_rule_three_percent_fails_and_names_the_next_safer_dtype() -> None:
    rule = GateRule()
    ok = decide([accuracy("mmlu", 0.700, 0.679)], rule, "int8_per_token_head")  # exactly 3.0%
    assert ok.passed and ok.exit_code == EXIT_PASS and ok.next_safer is None
    bad = decide([accuracy("mmlu", 0.700, 0.678), accuracy("hellaswag", 0.80, 0.80)], rule,
                 "int8_per_token_head")  # 3.14% on mmlu
    assert not bad.passed and bad.exit_code == EXIT_FAIL
    assert [r.check.name for r in bad.failures] == ["mmlu"]
    assert bad.next_safer == "fp8"
    assert "go back to FP8: --kv-cache-dtype fp8" in bad.advice()
    assert "mmlu +3.14%" in bad.advice()


def test_the_ladder_int8_fp8_fp16() -> None:
    assert next_safer("int8") == "fp8"
    assert next_safer("int8_per_token_head") == "fp8"
    assert next_safer("fp8_e4m3") == "auto"
    assert next_safer("fp8") == "auto"
    assert next_safer("int2") == "int8"
    assert next_safer("auto") is None and next_safer("bfloat16") is None
    failed_fp8 = decide([accuracy("mmlu", 0.7, 0.6)], GateRule(), "fp8")
    assert "go back to FP16/BF16 (auto): --kv-cache-dtype auto" in failed_fp8.advice()
    unquantized = decide([accuracy("mmlu", 0.7, 0.6)], GateRule(), "auto")
    assert unquantized.next_safer is None and "not quantized" in unquantized.advice()


def test_limits_per_check_and_kind_and_the_agreement_default() -> None:
    agreement = Check("greedy_agreement", "probe", 1.0, 0.93)  # 7% of argmaxes flipped
    perplexity = Check("perplexity", "probe", 40.0, 40.4, higher_is_better=False)  # +1%
    assert decide([agreement, perplexity], GateRule(), "fp8").passed  # agreement limit 10%
    strict = GateRule(limits={"greedy_agreement": 0.03})
    assert not decide([agreement, perplexity], strict, "fp8").passed
    by_kind = GateRule(max_drop=0.03, limits={"probe": 0.005})
    verdict = decide([perplexity, accuracy("arc", 0.5, 0.49)], by_kind, "fp8")
    assert [r.check.name for r in verdict.failures] == ["perplexity"]  # arc: 2% < 3%


def test_a_gate_with_nothing_to_judge_is_an_error() -> None:
    with pytest.raises(ValueError):
        decide([], GateRule(), "fp8")


def test_the_gate_judges_the_drop_beyond_the_noise_floor() -> None:
    noisy = Check("greedy_agreement", "probe", 1.0, 0.85, noise=0.06)  # 15% raw, 9% beyond
    assert decide([noisy], GateRule(), "fp8").passed
    worse = Check("greedy_agreement", "probe", 1.0, 0.80, noise=0.06)  # 14% beyond
    verdict = decide([worse], GateRule(), "fp8")
    assert not verdict.passed and "+14.00% beyond its noise floor" in verdict.advice()
