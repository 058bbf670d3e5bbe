"""Probe results reduced to one median per probe point, contended samples set aside.

A point is one prompt length of the ``prefill`` or ``cached`` probe, or one
batch size of ``decode``. Its value is the median TTFT (TPOT for decode) of
its samples.

Shared machine. When samples carry a :class:`~.cpu.CoreShare` and
``max_foreign`` is given, a point uses only the samples during which other
processes took at most that share of the engine's core; if fewer than
``min(3, n)`` of its ``n`` samples qualify, it uses the least-contended half
instead, so every point keeps a value. ``samples`` and ``discarded`` say how
many were used and set aside. Real engine and simulator go through the same
rule.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from loadtest.calibration.cpu import CoreShare
from loadtest.calibration.probes import (
    CACHED,
    DECODE,
    PREFILL,
    DecodeSample,
    PrefillSample,
    ProbeResults,
)

Sample = TypeVar("Sample", PrefillSample, DecodeSample)


@dataclass(frozen=True, slots=True)
class PointSummary:
    """The median of one probe point: ``x`` is prompt words or batch size."""

    probe: str
    x: int
    value: float
    """Median TTFT (prefill, cached) or TPOT (decode), seconds."""
    uncached_tokens: float
    """Median uncached prompt tokens (0 for decode)."""
    samples: int
    foreign_cpu: float | None = None
    """Median share of the engine's core other processes took during the samples used."""
    discarded: int = 0


def _foreign(core: CoreShare | None) -> float:
    return core.foreign if core is not None else 0.0


def quiet(samples: Sequence[Sample], max_foreign: float | None) -> list[Sample]:
    """The samples a point's median is taken over (see the module docstring)."""
    if max_foreign is None or all(s.core is None for s in samples):
        return list(samples)
    kept = [s for s in samples if _foreign(s.core) <= max_foreign]
    if len(kept) >= min(3, len(samples)):
        return kept
    ranked = sorted(samples, key=lambda s: _foreign(s.core))
    return ranked[: math.ceil(len(samples) / 2)]


def _point(
    probe: str,
    x: int,
    samples: Sequence[Sample],
    max_foreign: float | None,
    value: Callable[[Sample], float],
    uncached: Callable[[Sample], float],
) -> PointSummary:
    used = quiet(samples, max_foreign)
    shares = [s.core.foreign for s in used if s.core is not None]
    return PointSummary(
        probe=probe,
        x=x,
        value=statistics.median(value(s) for s in used),
        uncached_tokens=statistics.median(uncached(s) for s in used),
        samples=len(used),
        foreign_cpu=statistics.median(shares) if shares else None,
        discarded=len(samples) - len(used),
    )


def summarise(results: ProbeResults, max_foreign: float | None = None) -> list[PointSummary]:
    points: list[PointSummary] = []
    for probe in (PREFILL, CACHED):
        by_length: dict[int, list[PrefillSample]] = {}
        for sample in results.prefill:
            if sample.probe == probe:
                by_length.setdefault(sample.length, []).append(sample)
        for length, prefills in sorted(by_length.items()):
            points.append(_point(probe, length, prefills, max_foreign,
                                 lambda s: s.timing.ttft, lambda s: float(s.uncached_tokens)))
    by_batch: dict[int, list[DecodeSample]] = {}
    for trial in results.decode:
        by_batch.setdefault(trial.batch, []).append(trial)
    for batch, trials in sorted(by_batch.items()):
        points.append(_point(DECODE, batch, trials, max_foreign,
                             lambda t: t.tpot, lambda _: 0.0))
    return points
