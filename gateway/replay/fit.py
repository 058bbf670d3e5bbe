"""The latency model fitted from live replicas' own vLLM metrics.

Method. A replica is read (``gateway.replay.scrape``) every few seconds while
it serves its real traffic. Between two readings its counters grew; each such
window (merged with the next until it holds ``min_requests`` finished
requests or ``min_decode_tokens`` decoded tokens) gives two rows of the
simulator's step model (``engine.sim.latency``: each step lasts ``o + p *
prefill_tokens + d * sampling_seqs``, the sequences that get a token in it:
decoding ones and prompts it finishes), solved together by the same
non-negative least squares on relative errors the CPU calibration uses
(``engine.sim.latency_fit``):

* decode: the mean inter-token latency is the mean duration of the steps the
  decoded tokens were in (``D`` inter-token samples: one per decoding
  sequence per step; ``S`` steps: the count of ``iteration_tokens_total``;
  ``F`` first tokens: prompts finished). Those steps sampled ``(D + F) / S``
  sequences on average, and the window's ``P`` uncached prompt tokens
  (prefix-cache queries less hits) were computed beside ``Dt`` decoding
  sequences each, where ``Dt = ITL sum / window seconds`` is the time-average
  number of decoding sequences -- what a prompt arriving at a random moment
  finds. So the steps' prefill, per decoded token, is ``P * Dt / D``::

      mean ITL = o + p * P*Dt/D + d * (D + F)/S

* prefill: a request's prefill time (first scheduled to first token) spans
  its ``k = ceil(U / max_num_batched_tokens)`` chunks of ``U = P / F``
  uncached tokens, each step also decoding the ``Dt`` others, the last one
  sampling its first token::

      mean prefill time = k * o + p * U + d * (k * Dt + 1)

Why a prompt's last step pays ``d`` too: on two vLLM-on-CPU replicas here the
decode rows alone put nearly all of a step's cost on its sequences (ITL
~20 ms with one decoding, ~40 ms with two), while a prompt's prefill alone
cost ~20 ms plus ~0.14 ms a token; with ``d`` for decoding sequences only,
the one fit of both put that fixed cost on the prefill tokens (0.25 ms each),
and cold prompts' TTFT came out 40-50% high. Counting the sampled prompt as
one sequence, the residual fell from 24.5% to 16.0% and the replay's TTFT
p99 from +39% to -3% of the real run's (``loadtest/results/replay-check``).

Each row is weighted by the square root of the samples its mean is over.
Queue time is not part of the step model (it is what a replay predicts);
it is reported beside the fit, with the TTFT the replicas measured, as a
check.

Outside the steps. vLLM's TTFT runs from the request's arrival at its API
server to the first token back there; queue time and prefill time are the
engine's own part of it. What is left, ``mean TTFT - mean queue - mean
prefill`` over the windows, is the serving front: handing the request to the
engine process and the first token back (on a busy host, waiting for a CPU).
Given the gateway's trace of the same period (``gateway_ttft_s``: the mean
TTFT the gateway measured, arrival at the gateway to the first byte), the
difference from the replicas' mean TTFT adds the gateway's own work, the hop
and the API server's rendering and tokenizing. Their sum is the model's
``request_overhead_s``, which a replay adds to every TTFT: a constant, where
on a contended host it grows with load, so it is fitted at the load the
readings saw.

What makes a good fit: windows at different loads (a busy hour and a quiet
one) -- the decode rows then tell the step overhead from the per-sequence
cost. Windows where nothing happened are skipped. The approximations (means
of products taken as products of means; other requests' prefill in the same
step left out of the prefill row) are exact for one request at a time and
grow with load; ``rms_relative_residual`` says how well the rows agree.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from engine.sim.latency import LatencyModel
from engine.sim.latency_fit import fit_rows
from gateway.replay.scrape import Reading

MIN_REQUESTS = 5
MIN_DECODE_TOKENS = 200


class FitError(ValueError):
    """Nothing to fit: the readings saw no work (the message says what is missing)."""


@dataclass(frozen=True, slots=True)
class Window:
    replica: str
    seconds: float
    steps: float
    decode_samples: float
    itl_sum: float
    first_tokens: float
    uncached_tokens: float
    prefills: float
    prefill_sum: float
    queue_count: float
    queue_sum: float
    ttft_sum: float

    @property
    def decode_per_step(self) -> float:
        return self.decode_samples / self.steps if self.steps else 0.0

    @property
    def decoding(self) -> float:
        """Time-average decoding sequences over the window (``Dt``)."""
        return self.itl_sum / self.seconds if self.seconds > 0 else 0.0

    @property
    def prefill_per_decoded_token(self) -> float:
        """Prefill tokens in the steps of a decoded token, on average (``P * Dt / D``)."""
        if not self.decode_samples:
            return 0.0
        return self.uncached_tokens * self.decoding / self.decode_samples

    def rows(self, max_num_batched_tokens: int
             ) -> list[tuple[tuple[float, float, float], float, float]]:
        """``(row, measured mean, weight)`` for each of the window's rows that has data."""
        out = []
        if self.decode_samples > 0 and self.steps > 0:
            sampling = (self.decode_samples + self.first_tokens) / self.steps
            out.append(((1.0, self.prefill_per_decoded_token, sampling),
                        self.itl_sum / self.decode_samples, math.sqrt(self.decode_samples)))
        if self.prefills > 0 and self.first_tokens > 0 and self.prefill_sum > 0:
            uncached = max(1.0, self.uncached_tokens / self.first_tokens)
            chunks = float(math.ceil(uncached / max_num_batched_tokens))
            out.append(((chunks, uncached, chunks * self.decoding + 1.0),
                        self.prefill_sum / self.prefills, math.sqrt(self.prefills)))
        return out


def window(replica: str, a: Reading, b: Reading) -> Window:
    def delta(name: str) -> float:
        return max(0.0, b.get(name) - a.get(name))

    return Window(
        replica=replica, seconds=b.at - a.at, steps=delta("step_tokens_count"),
        decode_samples=delta("itl_count"), itl_sum=delta("itl_sum"),
        first_tokens=delta("ttft_count"),
        uncached_tokens=max(0.0, delta("queries") - delta("hits")),
        prefills=delta("prefill_count"), prefill_sum=delta("prefill_sum"),
        queue_count=delta("queue_count"), queue_sum=delta("queue_sum"),
        ttft_sum=delta("ttft_sum"))


def windows(replica: str, readings: Sequence[Reading], min_requests: int = MIN_REQUESTS,
            min_decode_tokens: int = MIN_DECODE_TOKENS) -> list[Window]:
    """Consecutive windows of one replica's readings, each with enough in it."""
    out: list[Window] = []
    if not readings:
        return out
    start = readings[0]
    for reading in readings[1:]:
        if reading.get("step_tokens_count") < start.get("step_tokens_count"):
            start = reading  # the replica restarted: its counters began again
            continue
        candidate = window(replica, start, reading)
        if candidate.prefills >= min_requests or candidate.decode_samples >= min_decode_tokens:
            out.append(candidate)
            start = reading
    return out


def _mean(total: float, count: float) -> float:
    return total / count if count > 0 else 0.0


@dataclass(frozen=True)
class Fit:
    model: LatencyModel
    rms_relative_residual: float
    rows: int
    windows: tuple[Window, ...] = field(repr=False)
    front_s: float = 0.0
    """The replicas' mean TTFT less their mean queue and prefill time (module docstring)."""
    gateway_s: float | None = None
    """The gateway's mean TTFT less the replicas' (None: no trace given)."""

    def check(self) -> dict[str, float | None]:
        """What the replicas measured over the windows, beside what the fit says."""
        ws = self.windows
        itl = [w.itl_sum / w.decode_samples for w in ws if w.decode_samples]
        return {"mean_queue_s": _mean(sum(w.queue_sum for w in ws),
                                      sum(w.queue_count for w in ws)),
                "mean_prefill_s": _mean(sum(w.prefill_sum for w in ws),
                                        sum(w.prefills for w in ws)),
                "mean_ttft_s": _mean(sum(w.ttft_sum for w in ws),
                                     sum(w.first_tokens for w in ws)),
                "median_window_itl_s": statistics.median(itl) if itl else None}


def fit_latency(readings: Mapping[str, Sequence[Reading]], max_num_seqs: int = 256,
                max_num_batched_tokens: int = 8192, min_requests: int = MIN_REQUESTS,
                min_decode_tokens: int = MIN_DECODE_TOKENS,
                source: dict[str, object] | None = None,
                gateway_ttft_s: float | None = None) -> Fit:
    """Fit the step model to every replica's windows together (one model, one hardware);
    ``gateway_ttft_s``: the gateway's mean TTFT over the same period, when known."""
    all_windows: list[Window] = []
    for replica, series in readings.items():
        all_windows += windows(replica, series, min_requests, min_decode_tokens)
    rows, targets, weights = [], [], []
    for each in all_windows:
        for row, target, weight in each.rows(max_num_batched_tokens):
            rows.append(row)
            targets.append(target)
            weights.append(weight)
    if not rows:
        raise FitError("the readings saw no finished requests and no decoded tokens: fit "
                       "while the replicas serve traffic (longer --duration)")
    solved = fit_rows(rows, targets, weights=weights)
    measured = Fit(LatencyModel(solved.params), 0.0, 0, tuple(all_windows)).check()
    mean_ttft = measured["mean_ttft_s"] or 0.0
    front = max(0.0, mean_ttft - (measured["mean_queue_s"] or 0.0)
                - (measured["mean_prefill_s"] or 0.0)) if mean_ttft else 0.0
    gateway = None if gateway_ttft_s is None else max(0.0, gateway_ttft_s - mean_ttft)
    last = [series[-1] for series in readings.values() if series]
    block_sizes = {r.block_size for r in last if r.block_size}
    capacities = [r.num_blocks for r in last if r.num_blocks]
    models = sorted({m for r in last for m in r.models})
    model = LatencyModel(
        params=solved.params, block_size=min(block_sizes) if block_sizes else 16,
        num_blocks=min(capacities) if capacities else 2048, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, model=models[0] if models else "",
        request_overhead_s=front + (gateway or 0.0),
        source={"method": "prefixgate fit: vLLM metrics windows", "replicas": sorted(readings),
                "windows": len(all_windows), "rows": solved.rows,
                "rms_relative_residual": round(solved.rms_relative_residual, 4),
                "serving_front_s": round(front, 6),
                "gateway_s": None if gateway is None else round(gateway, 6),
                **(source or {})})
    return Fit(model, solved.rms_relative_residual, solved.rows, tuple(all_windows), front,
               gateway)
