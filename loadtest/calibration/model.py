"""The simulator's latency model, written as a linear model, and its fit.

``engine.sim.scheduler`` runs each step for::

    step_overhead_s + prefill_tokens * prefill_per_token_s
                    + sampling_seqs * decode_per_seq_s

(``sampling_seqs``: the sequences that sample a token in the step, decoding
ones and prompts whose last chunk it computes.) How the probes compose into steps there (the rows of the fit):

* a lone request on an idle engine is admitted in the next step with its
  whole uncached prompt (in chunks of ``max_num_batched_tokens``, one step
  each); the step that computes the last prompt token samples the first
  output token, one sampling sequence. No other sequence decodes meanwhile, so
  ``TTFT = ceil(U / B) * step_overhead + U * prefill_per_token +
  decode_per_seq`` for ``U`` uncached tokens. A cached repeat has ``U`` = the
  last partial block (vLLM and the simulator both recompute at least the last
  token);
* ``C`` streams decoding together run one step per token with ``C`` decode
  sequences: ``TPOT = step_overhead + C * decode_per_seq``. (The first step or
  two also prefill the short prompts of streams that arrived a moment late;
  that bias is small and, being the same on both sides, the refinement below
  absorbs it.)

So each probe point is a row ``(steps, prefill tokens, decode seqs)`` and its
median latency the target. Parameters come from non-negative least squares
with *relative* residuals (each row divided by its measured value), so a
1 ms TPOT counts as much as a 100 ms TTFT and the fit minimises the same
relative error the report shows. The solver is the simulator's own
(``engine.sim.latency_fit``, shared with the fit from live replicas:
``gateway.replay.fit``).

Refinement. Measured on a client, the simulator is not exactly its model:
HTTP, tokenising and streaming add their own time, part of which hides inside
modeled steps. After a simulator run with parameters ``p``, each point's
deviation ``sim - model(p)`` is taken as the simulator's own bias, and the
model is fitted again to ``real - bias``. That is a Gauss-Newton step on the
real objective (sim vs real) with the design matrix as its Jacobian; one or
two rounds are enough when the bias barely depends on ``p``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from engine.sim.latency import PARAM_NAMES, LatencyParams
from engine.sim.latency_fit import fit_rows, nonnegative_lstsq
from loadtest.calibration.points import PointSummary
from loadtest.calibration.probes import DECODE, PREFILL

__all__ = [
    "FIT_PROBES",
    "PARAM_NAMES",
    "FitResult",
    "LatencyParams",
    "StepShape",
    "diagnostic_fits",
    "fit",
    "fit_targets",
    "nonnegative_lstsq",
    "predict",
    "refine",
    "row",
]

FIT_PROBES = (PREFILL, DECODE)
"""Probes the parameters are fitted on; ``cached`` stays out as a held-out check."""


@dataclass(frozen=True, slots=True)
class StepShape:
    """The scheduler limit that decides how a prompt splits into steps."""

    max_num_batched_tokens: int


@dataclass(frozen=True, slots=True)
class FitResult:
    params: LatencyParams
    probes: tuple[str, ...]
    rms_relative_residual: float
    """sqrt(mean(((model - target) / measured)^2)) over the fitted points."""
    points: int


def row(point: PointSummary, shape: StepShape) -> tuple[float, float, float]:
    """``(steps, prefill tokens, sampling seqs)`` of a point, as the simulator composes it
    (the step that ends a prompt samples its first token: one sequence)."""
    if point.probe == DECODE:
        return (1.0, 0.0, float(point.x))
    uncached = max(point.uncached_tokens, 1.0)
    steps = math.ceil(uncached / shape.max_num_batched_tokens)
    return (float(steps), uncached, 1.0)


def predict(params: LatencyParams, point: PointSummary, shape: StepShape) -> float:
    return float(np.dot(row(point, shape), params.vector()))


def fit_targets(
    points: Sequence[PointSummary],
    targets: Sequence[float],
    shape: StepShape,
    probes: Iterable[str] = FIT_PROBES,
) -> FitResult:
    """Fit the model to ``targets`` (one per point), weighting by the measured values."""
    wanted = tuple(probes)
    chosen = [(p, t) for p, t in zip(points, targets, strict=True) if p.probe in wanted]
    if not chosen:
        raise ValueError(f"no points of probes {wanted} to fit")
    solved = fit_rows([row(point, shape) for point, _ in chosen],
                      [target for _, target in chosen], [point.value for point, _ in chosen])
    return FitResult(params=solved.params, probes=wanted,
                     rms_relative_residual=solved.rms_relative_residual, points=solved.rows)


def fit(
    points: Sequence[PointSummary], shape: StepShape, probes: Iterable[str] = FIT_PROBES
) -> FitResult:
    """Fit the model to measured medians directly."""
    return fit_targets(points, [p.value for p in points], shape, probes)


def refine(
    params: LatencyParams,
    real: Sequence[PointSummary],
    sim: Sequence[PointSummary],
    shape: StepShape,
    probes: Iterable[str] = FIT_PROBES,
) -> FitResult:
    """One refinement round: remove the simulator's measured bias from the targets."""
    sim_by_key = {(p.probe, p.x): p for p in sim}
    targets: list[float] = []
    for point in real:
        twin = sim_by_key.get((point.probe, point.x))
        bias = 0.0 if twin is None else twin.value - predict(params, twin, shape)
        targets.append(point.value - bias)
    return fit_targets(real, targets, shape, probes)


def diagnostic_fits(points: Sequence[PointSummary], shape: StepShape) -> dict[str, FitResult]:
    """Each fitted probe alone: how far they disagree on the step overhead.

    (The cached probe has one uncached length, a block, at every point: it
    pins a constant, not a line, so it gets no fit of its own.)
    """
    present = {p.probe for p in points}
    return {probe: fit(points, shape, (probe,)) for probe in FIT_PROBES if probe in present}
