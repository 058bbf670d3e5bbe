"""``prefixgate replay``'s output: a text report, one JSON document, a plot of TTFT against N.

The text: what was replayed and on what, what the recorded run measured, one
row per replica count replayed, the answer when a target was asked, and each
replica's load at the answer (or at the largest count replayed). The JSON
holds the same and every figure of every replay (``ReplayOutcome.as_dict``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.sim.latency import LatencyModel
from gateway.replay.capacity import Capacity
from gateway.replay.outcome import ReplayOutcome
from gateway.replay.search import Question
from gateway.replay.workload import Recorded, Workload


@dataclass(frozen=True)
class ReplayContext:
    traces: tuple[str, ...]
    requests: int
    duration_s: float
    speed: float
    model: str
    latency: LatencyModel
    latency_source: str
    capacity: Capacity
    policy: str
    recorded: Recorded
    notes: tuple[str, ...] = ()
    """What the reader must know about the trace to read the figures (``trace_notes``)."""

    def as_dict(self) -> dict[str, Any]:
        return {"traces": list(self.traces), "requests": self.requests,
                "duration_s": round(self.duration_s, 3), "speed": self.speed,
                "model": self.model, "latency_model": self.latency.as_dict(),
                "latency_model_source": self.latency_source,
                "kv_blocks": self.capacity.blocks, "block_size": self.capacity.block_size,
                "kv_blocks_source": self.capacity.source, "policy": self.policy,
                "recorded": self.recorded.as_dict(), "notes": list(self.notes)}


IMPLAUSIBLE_RATE = 1000.0
"""Requests a second over a whole trace past which its timestamps are likely seconds."""


def trace_notes(workload: Workload, max_model_len: int | None = None) -> tuple[str, ...]:
    """Warnings about a trace that the figures alone would hide: no prefix information
    (every prompt its own), a pace that says the timestamps are not milliseconds, prompts
    that the planned replicas' ``max_model_len`` would refuse and the replay serves."""
    notes = []
    items = workload.items
    if items and not any(item.hash_ids for item in items):
        notes.append("the trace has no hash ids (a CSV trace such as Azure's or BurstGPT's "
                     "has none): every prompt is its own, so the hit rate is a floor and the "
                     "answer a question of load alone")
    span = workload.duration_s * workload.speed
    if len(items) >= 100 and span > 0 and len(items) / span > IMPLAUSIBLE_RATE:
        notes.append(f"{len(items):,} requests in {span:.3f} s ({len(items) / span:,.0f} a "
                     "second): if the trace's timestamps are seconds, not milliseconds, this "
                     "replays it 1000 times too fast")
    if max_model_len:
        longer = sum(1 for item in items if item.input_length > max_model_len)
        if longer:
            notes.append(f"{longer:,} of {len(items):,} prompts are longer than the planned "
                         f"max_model_len ({max_model_len:,} tokens): real replicas would refuse "
                         "them, the replay serves them (it refuses only what a KV cache "
                         "cannot hold)")
    return tuple(notes)


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1000:.0f} ms" if value >= 0.0095 else f"{value * 1000:.1f} ms"
    return f"{value:.2f} s"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _verdict(outcome: ReplayOutcome) -> str:
    if outcome.meets is None:
        return ""
    if outcome.meets:
        return "yes"
    return "no (stopped early)" if outcome.stopped else "no"


def render_text(context: ReplayContext, outcomes: Mapping[int, ReplayOutcome],
                question: Question | None, answer: int | None) -> str:
    c, p = context, context.latency.params
    lines = [
        (f"prefixgate replay: {len(c.traces)} trace file(s), {c.requests:,} requests over "
        f"{c.duration_s:,.1f} s at {c.speed:g}x the recorded pace (model {c.model})"),
        (f"replicas: steps of {seconds(p.step_overhead_s)} + "
        f"{p.prefill_per_token_s * 1e6:.3g} us per prefill token + "
        f"{seconds(p.decode_per_seq_s)} per decoding sequence, "
        f"{seconds(c.latency.request_overhead_s)} a request outside them "
        f"({c.latency_source}); max {c.latency.max_num_seqs} sequences, "
        f"{c.latency.max_num_batched_tokens:,} tokens a step"),
        (f"          {c.capacity.blocks:,} KV blocks of {c.capacity.block_size} tokens "
        f"({c.capacity.tokens:,} tokens) each ({c.capacity.source}); policy {c.policy}"),
    ]
    lines += [f"note: {note}" for note in c.notes]
    r = c.recorded
    if r.replicas or r.ttft_p50_s is not None or r.hit_rate is not None:
        who = f"{len(r.replicas)} replicas ({', '.join(r.replicas)})" if r.replicas else "?"
        policies = f", policy {', '.join(r.policies)}" if r.policies else ""
        lines.append(f"recorded: {who}{policies}: hit rate {_percent(r.hit_rate)}, "
                     f"TTFT p50 {seconds(r.ttft_p50_s)}, p99 {seconds(r.ttft_p99_s)}")
    target = ""
    if question is not None:
        q = f"p{question.quantile * 100:g}"
        target = f"  TTFT {q} < {seconds(question.ttft_limit_s)}"
    lines += ["", f"    N  hit rate  TTFT p50  TTFT p99  TPOT p50   req/s  busiest{target}"]
    for n in sorted(outcomes):
        o = outcomes[n]
        busiest = max((load.busy_s for load in o.loads), default=0.0)
        busy = f"{100 * busiest / o.span_s:.0f}%" if o.span_s else "-"
        lines.append(f"{n:5d}  {_percent(o.hit_rate):>8}  {seconds(o.ttft_p50_s):>8}  "
                     f"{seconds(o.ttft_p99_s):>8}  {seconds(o.tpot_p50_s):>8}  "
                     f"{o.requests_per_s:6.2f}  {busy:>7}  {_verdict(o)}")
    lines += _refused_lines(outcomes, c.capacity.tokens)
    if question is not None:
        lines.append("")
        lines.append(answer_line(question, answer, outcomes))
    shown = answer if answer is not None else (max(outcomes) if outcomes else None)
    if shown is not None:
        lines += ["", f"per replica at N={shown}:"] + replica_lines(outcomes[shown])
    return "\n".join(lines) + "\n"


def _refused_lines(outcomes: Mapping[int, ReplayOutcome], kv_tokens: int) -> list[str]:
    """The requests no replica could hold, which every figure above leaves out."""
    refused = {n: o.rejected for n, o in outcomes.items() if o.rejected}
    if not refused:
        return []
    first = outcomes[min(refused)]
    counts = set(refused.values())
    where = ("at every count" if len(counts) == 1 and len(refused) == len(outcomes)
             else "at N=" + ", ".join(f"{n} ({k:,})" for n, k in sorted(refused.items())))
    line = (f"refused: {max(counts):,} of {first.rejected + first.requests:,} requests {where}, "
            f"not replayed: prompt and answer longer than a replica's KV cache ({kv_tokens:,} "
            "tokens); the figures above leave them out")
    return [line]


def answer_line(question: Question, answer: int | None,
                outcomes: Mapping[int, ReplayOutcome]) -> str:
    q = f"p{question.quantile * 100:g}"
    limit = seconds(question.ttft_limit_s)
    if answer is None:
        if question.max_replicas in outcomes or not outcomes:  # a search: it tries the top
            return (f"answer: no replica count up to {question.max_replicas} keeps TTFT {q} "
                    f"under {limit}")
        tried = ", ".join(str(n) for n in sorted(outcomes))
        return f"answer: none of the counts replayed ({tried}) keeps TTFT {q} under {limit}"
    below = [n for n in outcomes if n < answer]
    missed = ""
    if below:
        n = max(below)
        o = outcomes[n]
        value = f">= {limit} (stopped early)" if o.stopped else seconds(o.ttft_q_s)
        missed = f" ({n}: {value})"
    return (f"answer: {answer} replica(s) keep TTFT {q} under {limit}: "
            f"{seconds(outcomes[answer].ttft_q_s)}{missed}")


SHOWN_REPLICAS = 16
"""Replicas listed in the text (the JSON lists them all)."""


def replica_lines(outcome: ReplayOutcome) -> list[str]:
    out = ["  replica  requests  hit rate   busy  mean batch  preemptions  longest queue"]
    loads = sorted(outcome.loads, key=lambda load: -load.busy_s)[:SHOWN_REPLICAS]
    for load in sorted(loads, key=lambda load: outcome.loads.index(load)):
        busy = f"{100 * load.busy_s / outcome.span_s:.0f}%" if outcome.span_s else "-"
        batch = load.running_s / load.busy_s if load.busy_s else 0.0
        out.append(f"  {load.id:>7}  {load.requests:8,}  {_percent(load.hit_rate):>8}  "
                   f"{busy:>5}  {batch:10.1f}  {load.preemptions:11,}  {load.peak_waiting:13,}")
    if len(outcome.loads) > SHOWN_REPLICAS:
        out.append(f"  (the {SHOWN_REPLICAS} busiest of {len(outcome.loads)}; --json lists all)")
    return out


def as_json(context: ReplayContext, outcomes: Mapping[int, ReplayOutcome],
            question: Question | None, answer: int | None) -> dict[str, Any]:
    return {
        **context.as_dict(),
        "question": None if question is None else {
            "ttft_limit_s": question.ttft_limit_s, "quantile": question.quantile,
            "min_replicas": question.min_replicas, "max_replicas": question.max_replicas},
        "answer": answer,
        "replays": [outcomes[n].as_dict() for n in sorted(outcomes)],
    }


def plot(outcomes: Mapping[int, ReplayOutcome], question: Question | None, path: Path,
         title: str, answer: int | None = None) -> None:
    """TTFT p99 (or the question's quantile) against N, the target as a line, the answer
    marked; needs matplotlib (``pip install prefixgate[loadtest]``)."""
    from gateway.replay.plot import draw  # matplotlib: only when a plot is asked for

    draw(_series(outcomes, question), question, path, title, answer)


def _series(outcomes: Mapping[int, ReplayOutcome], question: Question | None
            ) -> Sequence[tuple[int, float | None, float | None, bool]]:
    """(N, TTFT at the quantile, p50, stopped) for each replay."""
    return [(n, outcomes[n].ttft_q_s if question else outcomes[n].ttft_p99_s,
             outcomes[n].ttft_p50_s, outcomes[n].stopped) for n in sorted(outcomes)]
