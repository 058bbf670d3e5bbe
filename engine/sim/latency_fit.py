"""Fitting the simulator's latency model: non-negative least squares on relative errors.

Every way the project measures a replica reduces to rows of the same linear
model (``engine.sim.latency``): a measured latency ``y`` and how many step
overheads, prefill tokens and decoding sequence-steps went into it,
``(steps, prefill_tokens, sampling_seqs)``. The calibration against vLLM on CPU
(``loadtest.calibration.model``) builds its rows from probes; the fit from
live replicas' metrics (``gateway.replay.fit``) from windows of their
histograms. Both solve here.

Residuals are relative (each row divided by its measured value), so a 1 ms
inter-token latency counts as much as a 100 ms prefill, times an optional
weight per row (e.g. the square root of the requests a window's mean is
over). The non-negative solution is exact: with three unknowns every subset
of free parameters is solved and the best feasible one kept.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.sim.latency import LatencyParams


@dataclass(frozen=True, slots=True)
class RowFit:
    params: LatencyParams
    rms_relative_residual: float
    """sqrt(mean(((model - target) / measured)^2)) over the rows (unweighted)."""
    rows: int


def nonnegative_lstsq(matrix: np.ndarray, target: np.ndarray) -> np.ndarray:
    """argmin ||matrix @ x - target|| subject to x >= 0, by trying every free set.

    Columns that are all zero (a parameter no row touches) stay 0.
    """
    columns = matrix.shape[1]
    usable = [c for c in range(columns) if np.any(matrix[:, c] != 0)]
    best = np.zeros(columns)
    best_cost = float(np.sum(target**2))
    for size in range(1, len(usable) + 1):
        for free in itertools.combinations(usable, size):
            solution, *_ = np.linalg.lstsq(matrix[:, free], target, rcond=None)
            if np.any(solution < 0):
                continue
            candidate = np.zeros(columns)
            candidate[list(free)] = solution
            cost = float(np.sum((matrix @ candidate - target) ** 2))
            if cost < best_cost - 1e-18:
                best, best_cost = candidate, cost
    return best


def fit_rows(
    rows: Sequence[tuple[float, float, float]],
    targets: Sequence[float],
    measured: Sequence[float] | None = None,
    weights: Sequence[float] | None = None,
) -> RowFit:
    """Fit ``rows @ params ~ targets``, residuals relative to ``measured`` (default: the
    targets themselves) and multiplied by ``weights`` (default 1)."""
    if not rows:
        raise ValueError("no rows to fit")
    matrix = np.array(rows, dtype=float)
    goal = np.array(targets, dtype=float)
    scale = 1.0 / np.array(measured if measured is not None else targets, dtype=float)
    weight = np.array(weights, dtype=float) if weights is not None else np.ones(len(rows))
    factor = scale * weight
    solution = nonnegative_lstsq(matrix * factor[:, None], goal * factor)
    residual = (matrix @ solution - goal) * scale
    return RowFit(LatencyParams.from_vector(solution.tolist()),
                  float(np.sqrt(np.mean(residual**2))), len(rows))
