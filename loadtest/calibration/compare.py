"""Simulator vs real engine, point by point and probe by probe.

Each probe point (a prompt length, or a batch size) is compared on its
median: relative error ``sim / real - 1`` (positive: the simulator is
slower). Per probe the report gives the median and the maximum of the
absolute errors over its points; the single ``score`` used to pick the best
refinement round is the RMS relative error over every point of the fitted
probes, the quantity the fit minimises.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from loadtest.calibration.model import FIT_PROBES
from loadtest.calibration.points import PointSummary


@dataclass(frozen=True, slots=True)
class PointError:
    probe: str
    x: int
    real: float
    sim: float

    @property
    def relative(self) -> float:
        return self.sim / self.real - 1.0


@dataclass(frozen=True, slots=True)
class ProbeAccuracy:
    probe: str
    metric: str
    median_abs: float
    max_abs: float
    points: int


@dataclass(frozen=True, slots=True)
class Comparison:
    points: tuple[PointError, ...]
    probes: tuple[ProbeAccuracy, ...]

    def score(self, probes: Iterable[str] = FIT_PROBES) -> float:
        wanted = set(probes)
        errors = [p.relative for p in self.points if p.probe in wanted]
        return math.sqrt(sum(e * e for e in errors) / len(errors)) if errors else math.inf


def metric_of(probe: str) -> str:
    return "TPOT" if probe == "decode" else "TTFT"


def compare(real: Sequence[PointSummary], sim: Sequence[PointSummary]) -> Comparison:
    sim_by_key = {(p.probe, p.x): p for p in sim}
    points = tuple(
        PointError(point.probe, point.x, point.value, sim_by_key[(point.probe, point.x)].value)
        for point in real
        if (point.probe, point.x) in sim_by_key
    )
    probes: list[ProbeAccuracy] = []
    for probe in dict.fromkeys(p.probe for p in points):
        errors = [abs(p.relative) for p in points if p.probe == probe]
        probes.append(ProbeAccuracy(probe, metric_of(probe), statistics.median(errors),
                                 max(errors), len(errors)))
    return Comparison(points, tuple(probes))
