"""What the real replicas did beside what the replay predicted, and whether it held.

Figures, the same definitions on both sides (``gateway.replay.outcome``):
hit rate is cached over prompt tokens (the real side: ``cached_tokens`` each
replica reported in its ``usage``, as the trace recorded it); TTFT
percentiles by the nearest-rank rule, the real side as the gateway measured
it (``ttft_ms`` in the trace: arrival at the gateway to the first byte from
the replica), the replay's from arrival to the simulated engine's first token.

Targets (issue 28):

* the base replay: hit rate within ``HIT_POINTS`` (2) percentage points of
  the real run's, TTFT p50 within ``TTFT_SHARE`` (20%); p99 is stated, not
  judged;
* each what-if, as a change from the base on both sides (the real what-if
  run against the real base run, the what-if replay against the base replay):
  the *direction* holds when both changes have the same sign, or both are too
  small to count (under ``FLAT_POINTS`` points of hit rate, ``FLAT_SHARE`` of
  TTFT); the *size* holds when the predicted change of hit rate is within
  ``HIT_POINTS`` of the real one, and the predicted TTFT ratio (what-if over
  base) within ``TTFT_SHARE`` of the real ratio.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gateway.replay.workload import build_workload, read_lines

HIT_POINTS = 0.02
TTFT_SHARE = 0.20
FLAT_POINTS = 0.01
FLAT_SHARE = 0.05


@dataclass(frozen=True)
class Figures:
    requests: int
    hit_rate: float | None
    ttft_p50_s: float | None
    ttft_p99_s: float | None

    def get(self, metric: str) -> float | None:
        value: float | None = getattr(self, metric)
        return value


METRICS = (("hit_rate", "hit rate"), ("ttft_p50_s", "TTFT p50"), ("ttft_p99_s", "TTFT p99"))


def real_figures(trace: Path) -> Figures:
    """What a real run did, read from the trace the gateway recorded of it."""
    recorded = build_workload(read_lines([trace])).recorded()
    return Figures(recorded.requests, recorded.hit_rate, recorded.ttft_p50_s,
                   recorded.ttft_p99_s)


def sim_figures(document: dict[str, Any]) -> Figures:
    """What a replay predicted: its one replica count's outcome."""
    outcome = document["replays"][0]
    return Figures(int(outcome["completed"]), outcome["hit_rate"], outcome["ttft_p50_s"],
                   outcome["ttft_p99_s"])


@dataclass(frozen=True)
class Check:
    scenario: str
    metric: str
    real: float
    """The real value (base) or the real change (what-if: points, or a ratio)."""
    predicted: float
    target: str
    met: bool | None
    """None: stated, not judged."""
    direction_met: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def base_checks(real: Figures, sim: Figures) -> list[Check]:
    out = []
    if real.hit_rate is not None and sim.hit_rate is not None:
        out.append(Check("base", "hit rate", real.hit_rate, sim.hit_rate,
                         f"within {HIT_POINTS * 100:g} points",
                         abs(sim.hit_rate - real.hit_rate) <= HIT_POINTS + 1e-12))
    if real.ttft_p50_s and sim.ttft_p50_s is not None:
        out.append(Check("base", "TTFT p50", real.ttft_p50_s, sim.ttft_p50_s,
                         f"within {TTFT_SHARE:.0%}",
                         abs(sim.ttft_p50_s / real.ttft_p50_s - 1) <= TTFT_SHARE + 1e-12))
    if real.ttft_p99_s is not None and sim.ttft_p99_s is not None:
        out.append(Check("base", "TTFT p99", real.ttft_p99_s, sim.ttft_p99_s, "stated", None))
    return out


def noise_checks(real_base: Figures, repeat: Figures) -> list[Check]:
    """How far two real runs of the same workload fell apart (stated, not judged)."""
    out = []
    if real_base.hit_rate is not None and repeat.hit_rate is not None:
        out.append(Check("repeat", "hit rate change (points)",
                         repeat.hit_rate - real_base.hit_rate, 0.0, "stated", None))
    for metric, label in METRICS[1:]:
        before, after = real_base.get(metric), repeat.get(metric)
        if before and after:
            out.append(Check("repeat", f"{label} ratio to base", after / before, 1.0, "stated",
                             None))
    return out


def _same_direction(real: float, predicted: float, flat: float) -> bool:
    if abs(real) < flat and abs(predicted) < flat:
        return True
    return (real > 0) == (predicted > 0) and abs(real) >= flat / 2 and abs(predicted) >= flat / 2


def what_if_checks(scenario: str, real_base: Figures, real: Figures, sim_base: Figures,
                   sim: Figures) -> list[Check]:
    out = []
    hits = (real_base.hit_rate, real.hit_rate, sim_base.hit_rate, sim.hit_rate)
    if hits[0] is not None and hits[1] is not None and hits[2] is not None \
            and hits[3] is not None:
        real_delta = hits[1] - hits[0]
        predicted_delta = hits[3] - hits[2]
        out.append(Check(scenario, "hit rate change (points)", real_delta, predicted_delta,
                         f"within {HIT_POINTS * 100:g} points",
                         abs(predicted_delta - real_delta) <= HIT_POINTS + 1e-12,
                         _same_direction(real_delta, predicted_delta, FLAT_POINTS)))
    for metric, label in METRICS[1:]:
        rb, r, sb, s = (real_base.get(metric), real.get(metric), sim_base.get(metric),
                        sim.get(metric))
        if not (rb and r and sb and s):
            continue
        real_ratio, predicted_ratio = r / rb, s / sb
        out.append(Check(scenario, f"{label} ratio to base", real_ratio, predicted_ratio,
                         f"within {TTFT_SHARE:.0%} of the real ratio",
                         abs(predicted_ratio / real_ratio - 1) <= TTFT_SHARE + 1e-12,
                         _same_direction(real_ratio - 1, predicted_ratio - 1, FLAT_SHARE)))
    return out
