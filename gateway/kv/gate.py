"""The KV-cache quality gate's decision: pure arithmetic over named checks.

A :class:`Check` is one figure measured on the baseline and on the
candidate. Its **relative drop** is ``(baseline − candidate) / |baseline|``
when higher is better (task accuracy, token agreement) and ``(candidate −
baseline) / |baseline|`` when lower is better (perplexity), so a positive
drop always means the candidate is worse: accuracy 0.700 -> 0.672 is a 4.0%
drop; perplexity 10.0 -> 10.2 a 2.0% drop.

A check may carry its **noise floor**: the drop the same figure shows
between two equal runs (``gateway.kv.quality_probe`` measures it, the candidate
against itself). The gate judges the drop *beyond* it, so run-to-run noise
is not blamed on the KV dtype.

The rule (the usual deployment guide's, made configurable): the candidate
fails when any check drops beyond its noise floor by more than its limit -- ``max_drop`` (default
3%) for every check, unless ``limits`` names a check (or a check kind,
``probe`` / ``lm-eval``) with a limit of its own. By default only the probe's
``greedy_agreement`` has one, 10%: it counts argmax flips between near-tied
tokens, which move no task's accuracy, and on SmolLM2-135M an FP8 cache
(about 1% more perplexity) already flips 5-8% of them (BENCHMARKS.md); 3%
there would fail every FP8 cache of a small model. Perplexity and every
lm-eval task keep the guide's 3%. A failed candidate is sent
one step back along the ladder INT8 -> FP8 -> FP16 (``auto``, the model's own
16-bit dtype; anything below 8 bits goes back to INT8), and the verdict
names that dtype. A drop exactly at the limit passes.

Exit codes for CI: :data:`EXIT_PASS` 0, :data:`EXIT_FAIL` 1 (the candidate
lost too much), :data:`EXIT_ERROR` 2 (nothing could be judged: bad input, an
endpoint down, lm-eval asked for but not installed).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_ERROR = 2
DEFAULT_MAX_DROP = 0.03
DEFAULT_LIMITS: Mapping[str, float] = MappingProxyType({"greedy_agreement": 0.10})

LADDER = ("int2", "int4", "int8", "fp8", "auto")
"""Least to most precise. ``fp8*`` and ``int8*`` names are folded to their rung."""


def rung(kv_dtype: str) -> str:
    name = kv_dtype.lower()
    if name in ("auto", "float16", "bfloat16", "fp16", "bf16", "half"):
        return "auto"
    if name.startswith("fp8"):
        return "fp8"
    for step in ("int8", "int4", "int2"):
        if name.startswith(step):
            return step
    return name


def next_safer(kv_dtype: str) -> str | None:
    """One rung up: int8 -> fp8 -> auto; below 8 bits -> int8; ``None`` from auto or unknown."""
    step = rung(kv_dtype)
    if step in ("int2", "int4"):
        return "int8"
    if step not in LADDER or step == "auto":
        return None
    return LADDER[LADDER.index(step) + 1]


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    kind: str
    """``probe`` or ``lm-eval``."""
    baseline: float
    candidate: float
    higher_is_better: bool = True
    noise: float = 0.0
    """The drop the same measurement shows between two equal runs (its noise floor;
    0 where it is not measured, as for lm-eval tasks)."""

    @property
    def beyond_noise(self) -> float:
        """The relative drop less the noise floor: what the gate judges."""
        return self.relative_drop - self.noise

    @property
    def relative_drop(self) -> float:
        if self.baseline == 0:
            return 0.0 if self.candidate == self.baseline else float("inf")
        delta = self.baseline - self.candidate if self.higher_is_better \
            else self.candidate - self.baseline
        return delta / abs(self.baseline)


@dataclass(frozen=True, slots=True)
class GateRule:
    max_drop: float = DEFAULT_MAX_DROP
    limits: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_LIMITS))
    """Per check name or kind, overriding ``max_drop``."""

    def limit(self, check: Check) -> float:
        return self.limits.get(check.name, self.limits.get(check.kind, self.max_drop))


@dataclass(frozen=True, slots=True)
class CheckResult:
    check: Check
    limit: float

    @property
    def passed(self) -> bool:
        # Rounded so that 0.03 judged against a 3% limit is not lost to float noise.
        return round(self.check.beyond_noise, 9) <= round(self.limit, 9)


@dataclass(frozen=True, slots=True)
class Verdict:
    candidate_kv_dtype: str | None
    results: tuple[CheckResult, ...]

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def failures(self) -> tuple[CheckResult, ...]:
        return tuple(r for r in self.results if not r.passed)

    @property
    def next_safer(self) -> str | None:
        if self.passed or self.candidate_kv_dtype is None:
            return None
        return next_safer(self.candidate_kv_dtype)

    @property
    def exit_code(self) -> int:
        return EXIT_PASS if self.passed else EXIT_FAIL

    def advice(self) -> str:
        if self.passed:
            return f"PASS: no check dropped by more than its limit ({len(self.results)} checks)"
        worst = max(self.failures, key=lambda r: r.check.beyond_noise)
        noise = (f", {worst.check.beyond_noise:+.2%} beyond its noise floor"
                 if worst.check.noise else "")
        text = (f"FAIL: {len(self.failures)} of {len(self.results)} checks dropped too far "
                f"(worst: {worst.check.name} {worst.check.relative_drop:+.2%}{noise} against "
                f"{worst.limit:.1%})")
        safer = self.next_safer
        if safer:
            label = "FP16/BF16 (auto)" if safer == "auto" else safer.upper()
            text += f"; go back to {label}: --kv-cache-dtype {safer}"
        elif self.candidate_kv_dtype and rung(self.candidate_kv_dtype) == "auto":
            text += "; the candidate's KV cache is not quantized, so the loss is not the KV dtype's"
        return text


def decide(checks: Sequence[Check], rule: GateRule, candidate_kv_dtype: str | None) -> Verdict:
    if not checks:
        raise ValueError("the gate needs at least one check")
    return Verdict(candidate_kv_dtype, tuple(CheckResult(c, rule.limit(c)) for c in checks))
