"""What ``prefixgate kv-quality`` prints: the human report and the ``--json`` object.

Both carry the emulation label whenever either endpoint is the transformers
KV emulation (``engine.vllm.kv_emulation``): the header line of the text report,
``"emulation": true`` and a ``"label"`` sentence in the JSON, and a closing
line, so a figure copied out of either cannot pass for a vLLM measurement.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.kv.gate import Verdict
from gateway.kv.quality_probe import Endpoint, QualityProbeResult

EMULATION_LABEL = ("EMULATION: a transformers reference whose KV cache is round-tripped through "
                   "the candidate's dtype, not a vLLM kernel")


@dataclass(frozen=True, slots=True)
class Report:
    baseline: Endpoint
    candidate: Endpoint
    candidate_kv_dtype: str | None
    probe: QualityProbeResult
    verdict: Verdict
    continuation_tokens: int
    lm_eval: Mapping[str, Mapping[str, Mapping[str, float]]] | None = None
    """``{"baseline": {task: {metric: value}}, "candidate": {...}}`` when lm-eval ran."""

    @property
    def emulation(self) -> bool:
        return self.probe.emulation


def as_dict(report: Report) -> dict[str, Any]:
    probe = report.probe
    verdict = report.verdict
    return {
        "emulation": report.emulation,
        "label": EMULATION_LABEL if report.emulation else "real endpoints",
        "baseline": {"url": report.baseline.url, "model": report.baseline.model,
                     "fingerprint": probe.baseline_fingerprint},
        "candidate": {"url": report.candidate.url, "model": report.candidate.model,
                      "fingerprint": probe.candidate_fingerprint,
                      "kv_cache_dtype": report.candidate_kv_dtype},
        "probe": {
            **probe.summary.as_dict(),
            "continuation_tokens": report.continuation_tokens,
            "by_language": {lang: s.as_dict() for lang, s in probe.by_language().items()},
            "passages": [{"language": p.language, "title": p.title, "tokens": p.tokens,
                          "agreement": p.agreement_hits / p.agreement_total,
                          "free_run_match": p.free_run_match,
                          "baseline_continuation": p.baseline_text,
                          "candidate_continuation": p.candidate_text}
                         for p in probe.passages],
        },
        "lm_eval": report.lm_eval,
        "checks": [{"name": r.check.name, "kind": r.check.kind, "baseline": r.check.baseline,
                    "candidate": r.check.candidate, "relative_drop": r.check.relative_drop,
                    "noise_floor": r.check.noise, "drop_beyond_noise": r.check.beyond_noise,
                    "limit": r.limit, "passed": r.passed} for r in verdict.results],
        "passed": verdict.passed,
        "next_safer_kv_dtype": verdict.next_safer,
        "advice": verdict.advice(),
        "exit_code": verdict.exit_code,
    }


def render(report: Report) -> str:
    probe, verdict = report.probe, report.verdict
    summary = probe.summary
    languages = probe.by_language()
    lines = []
    if report.emulation:
        lines += [f"prefixgate kv-quality -- {EMULATION_LABEL}", ""]
    else:
        lines += ["prefixgate kv-quality", ""]
    lines += [
        (f"baseline   {report.baseline.url}  {report.baseline.model}  "
         f"({probe.baseline_fingerprint or 'no fingerprint'})"),
        (f"candidate  {report.candidate.url}  {report.candidate.model}  "
         f"({probe.candidate_fingerprint or 'no fingerprint'}), KV dtype "
         f"{report.candidate_kv_dtype or 'unknown'}"),
        (f"corpus     {len(probe.passages)} passages, {summary.tokens:,} scored tokens "
         f"({', '.join(languages)}), {report.continuation_tokens}-token greedy continuations"),
        "",
        (f"{'language':<9}{'tokens':>7}{'ppl base':>10}{'ppl cand':>10}{'ratio':>8}"
         f"{'Δ lp/token':>12}{'agreement':>11}{'free-run':>10}"),
    ]
    for name, s in [*languages.items(), ("all", summary)]:
        lines.append(f"{name:<9}{s.tokens:>7,}{s.perplexity_baseline:>10.3f}"
                     f"{s.perplexity_candidate:>10.3f}{s.perplexity_ratio:>8.4f}"
                     f"{s.mean_logprob_diff:>+12.4f}{s.greedy_agreement:>11.1%}"
                     f"{s.free_run_agreement:>10.1%}")
    lines += ["", (f"noise floor (the candidate against itself): greedy agreement "
                   f"{summary.floor_agreement:.1%}, perplexity ratio "
                   f"{summary.floor_perplexity_ratio:.4f}")]
    if report.lm_eval:
        lines += ["", "lm-eval"]
        for side in ("baseline", "candidate"):
            for task, figures in sorted(report.lm_eval.get(side, {}).items()):
                shown = ", ".join(f"{k} {v:.4f}" for k, v in sorted(figures.items()))
                lines.append(f"  {side:<9} {task}: {shown}")
    lines += ["", ("checks (relative drop; a positive drop means the candidate is worse; "
                   "judged beyond the noise floor)")]
    for r in verdict.results:
        c = r.check
        lines.append(f"  {c.name:<28} {c.baseline:>10.4f} -> {c.candidate:<10.4f} "
                     f"{c.relative_drop:>+8.2%}  noise {c.noise:>6.2%}  "
                     f"beyond {c.beyond_noise:>+7.2%}  limit {r.limit:.1%}  "
                     + ("pass" if r.passed else "FAIL"))
    lines += ["", verdict.advice()]
    if report.emulation:
        lines.append("(emulation: these figures are the transformers reference's, not vLLM's)")
    return "\n".join(lines)
