"""What a calibration produced, as typed values (the report renders them).

A :class:`Calibration` holds the real engine's raw probe results and their
per-point medians, each probe fitted alone (diagnostics), and one
:class:`SimRound` per simulator run: the fit it was started with, its raw
results and how it compared. ``best`` is the round with the lowest RMS
relative error on the fitted probes; its parameters are the answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from loadtest.calibration.compare import Comparison
from loadtest.calibration.model import FitResult, StepShape
from loadtest.calibration.points import PointSummary
from loadtest.calibration.probes import ProbePlan, ProbeResults
from loadtest.calibration.targets import EngineLimits, Target


@dataclass(frozen=True, slots=True)
class SimRound:
    index: int
    fit: FitResult
    results: ProbeResults
    points: tuple[PointSummary, ...]
    comparison: Comparison
    seconds: float


@dataclass(frozen=True, slots=True)
class Calibration:
    target: Target
    plan: ProbePlan
    limits: EngineLimits
    shape: StepShape
    tokenizer: str
    max_foreign: float | None
    """The contention filter of ``calibration.points`` (``None``: every sample)."""
    real: ProbeResults
    real_points: tuple[PointSummary, ...]
    real_seconds: float
    diagnostics: dict[str, FitResult]
    rounds: tuple[SimRound, ...]

    @property
    def best(self) -> SimRound:
        return min(self.rounds, key=lambda r: r.comparison.score())
