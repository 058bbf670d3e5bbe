"""Simulator calibration: the fit recovers known parameters, rows match the simulated
engine, refinement removes a simulator's own bias, and streams are timed by token count.

No server and no sleeping: synthetic points come from the latency model, the
simulated engine is stepped by hand, and the stream timer reads canned SSE
bodies with a fake clock.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.sim.cache import PrefixCache
from engine.sim.config import SimConfig
from engine.sim.request import EngineRequest, TokenEvent
from engine.sim.scheduler import Engine
from engine.sim.textgen import OutputSpec, OutputText
from loadtest.calibration.compare import compare
from loadtest.calibration.cpu import CoreMeter, CoreReading, CoreShare
from loadtest.calibration.model import (
    LatencyParams,
    StepShape,
    fit,
    nonnegative_lstsq,
    predict,
    refine,
    row,
)
from loadtest.calibration.points import PointSummary, quiet, summarise
from loadtest.calibration.probes import (
    CACHED,
    DECODE,
    PREFILL,
    CalibrationProbeError,
    CompletionCall,
    DecodeSample,
    ProbeResults,
    StreamTiming,
    timed_completion,
)
from loadtest.client import ChatCall, ChatOutcome, StreamReading

TRUE = LatencyParams(step_overhead_s=0.012, prefill_per_token_s=4e-5, decode_per_seq_s=0.0015)
SHAPE = StepShape(max_num_batched_tokens=2048)
LENGTHS = (128, 256, 512, 1024, 1536)
BATCHES = (1, 2, 4, 8, 16)


def synthetic_points(
    params: LatencyParams, noise: float = 0.0, seed: int = 0, bias: float = 0.0
) -> list[PointSummary]:
    """Medians as the model predicts them, times (1 + noise), plus an additive bias."""
    rng = random.Random(seed)
    shapes = [PointSummary(PREFILL, n, 0.0, float(n), 7) for n in LENGTHS]
    shapes += [PointSummary(CACHED, n, 0.0, 32.0, 7) for n in LENGTHS]
    shapes += [PointSummary(DECODE, c, 0.0, 0.0, 5) for c in BATCHES]
    points = []
    for shape in shapes:
        value = predict(params, shape, SHAPE) * (1 + rng.uniform(-noise, noise)) + bias
        points.append(PointSummary(shape.probe, shape.x, value, shape.uncached_tokens, 7))
    return points


def test_fit_recovers_known_parameters_exactly_without_noise() -> None:
    result = fit(synthetic_points(TRUE), SHAPE)
    np.testing.assert_allclose(result.params.vector(), TRUE.vector(), rtol=1e-9)
    assert result.rms_relative_residual < 1e-9
    assert result.points == len(LENGTHS) + len(BATCHES)  # the cached probe is held out


@pytest.mark.parametrize("seed", range(5))
def test_fit_recovers_known_parameters_under_3_percent_noise(seed: int) -> None:
    result = fit(synthetic_points(TRUE, noise=0.03, seed=seed), SHAPE)
    np.testing.assert_allclose(result.params.vector(), TRUE.vector(), rtol=0.15)


def test_fit_never_returns_a_negative_parameter() -> None:
    # Measured TPOT that falls with the batch would want a negative cost per sequence.
    points = [PointSummary(DECODE, c, 0.010 - 0.0001 * c, 0.0, 3) for c in BATCHES]
    params = fit(points, SHAPE, (DECODE,)).params
    assert params.decode_per_seq_s == 0.0 and params.prefill_per_token_s == 0.0
    assert params.step_overhead_s == pytest.approx(0.0094, rel=0.05)


def test_nonnegative_lstsq_matches_lstsq_when_unconstrained_is_feasible() -> None:
    matrix = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0]])
    target = np.array([1.0, 3.0, 5.0])
    np.testing.assert_allclose(nonnegative_lstsq(matrix, target), [1.0, 2.0])
    # intercept would be -1: clamped to 0 and the slope refitted through the origin
    np.testing.assert_allclose(nonnegative_lstsq(matrix, np.array([-1.0, 0.0, 1.0]))[0], 0.0)


def test_refinement_removes_a_constant_simulator_bias() -> None:
    real = synthetic_points(TRUE)
    first = fit(real, SHAPE).params
    # A simulator that adds 3 ms of its own to every measured latency.
    sim = synthetic_points(first, bias=0.003)
    refined = refine(first, real, sim, SHAPE).params
    after = synthetic_points(refined, bias=0.003)
    assert compare(real, after).score() < 0.02 < compare(real, sim).score()
    assert refined.step_overhead_s == pytest.approx(TRUE.step_overhead_s - 0.003, rel=0.05)


def test_a_prompt_longer_than_the_token_budget_takes_two_steps() -> None:
    long = PointSummary(PREFILL, 3000, 0.0, 3000.0, 1)
    assert row(long, StepShape(2048)) == (2.0, 3000.0, 1.0)  # the last chunk samples
    assert row(PointSummary(DECODE, 8, 0.0, 0.0, 1), SHAPE) == (1.0, 0.0, 8.0)


# -- the rows describe what the simulated engine really does ---------------------


class _Clock:
    def __call__(self) -> float:
        return 0.0


def _engine(params: LatencyParams) -> Engine:
    config = SimConfig(block_size=32, num_blocks=512, max_model_len=4096,
                       max_num_batched_tokens=SHAPE.max_num_batched_tokens,
                       step_overhead_s=params.step_overhead_s,
                       prefill_per_token_s=params.prefill_per_token_s,
                       decode_per_seq_s=params.decode_per_seq_s)
    return Engine(config, PrefixCache(config.num_blocks, config.block_size), wall_clock=_Clock())


def _request(engine: Engine, prompt: list[int], max_tokens: int, name: str) -> EngineRequest:
    events: list[TokenEvent] = []
    output = OutputText(OutputSpec(max_tokens=max_tokens, ignore_eos=True), prompt, 0, 0, 1, 8)
    request = EngineRequest(name, 0, prompt, output, events.append, max_tokens=max_tokens)
    engine.add(request)
    return request


def _drain(engine: Engine) -> None:
    while engine.has_work:
        engine.step()


@pytest.mark.parametrize("length", [128, 1536, 3000])
def test_modeled_ttft_of_a_cold_and_a_cached_prompt_match_the_rows(length: int) -> None:
    engine = _engine(TRUE)
    prompt = list(range(1, length + 1))
    cold = _request(engine, prompt, 1, "cold")
    _drain(engine)
    warm = _request(engine, prompt, 1, "warm")
    _drain(engine)
    for request in (cold, warm):
        uncached = length - request.num_cached_tokens
        point = PointSummary(PREFILL, length, 0.0, float(uncached), 1)
        assert request.first_token_time is not None
        ttft = request.first_token_time - request.arrival_time
        assert ttft == pytest.approx(predict(TRUE, point, SHAPE))
    # the last (partial or full) block is computed again
    assert length - warm.num_cached_tokens == (length - 1) % 32 + 1


@pytest.mark.parametrize("batch", [1, 4, 16])
def test_modeled_tpot_of_a_decoding_batch_matches_the_row(batch: int) -> None:
    engine = _engine(TRUE)
    requests = [_request(engine, [i + 1] * 16, 8, f"r{i}") for i in range(batch)]
    engine.step()  # all prompts prefill in one step
    first = {r.request_id: r.first_token_time for r in requests}
    _drain(engine)
    for request in requests:
        assert request.last_token_time is not None
        tpot = (request.last_token_time - (first[request.request_id] or 0.0)) / 7
        assert tpot == pytest.approx(predict(TRUE, PointSummary(DECODE, batch, 0, 0, 1), SHAPE))


# -- timing a stream ----------------------------------------------------------------


class _StepClock:
    """Each reading is 10 ms after the previous one."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.010
        return self.now


def _sse(chunks: list[dict[str, object]]) -> bytes:
    lines = [f"data: {json.dumps(chunk)}\n\n" for chunk in chunks]
    return ("".join(lines) + "data: [DONE]\n\n").encode()


class _CannedReplica:
    """A stream client whose every answer is one canned status and SSE body,
    read line by line as the lean client reads the wire."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status, self.body = status, body
        self.sent: list[dict[str, Any]] = []

    async def stream_chat(self, model: str, call: ChatCall, clock: Callable[[], float],
                          run_start: float) -> ChatOutcome:
        self.sent.append(call.request(model))
        reading = StreamReading(call, clock, run_start)
        if self.status != 200:
            return reading.outcome(f"HTTP {self.status}: {self.body.decode()}", None)
        for line in self.body.splitlines(keepends=True):
            reading.sse_line(line)
        return reading.outcome(None, None)

    async def close(self) -> None:
        pass


def _time(replica: _CannedReplica) -> StreamTiming:
    return asyncio.run(timed_completion(replica, "m", CompletionCall("a b c", 4), _StepClock()))


def test_ttft_and_tpot_follow_token_counts_not_text() -> None:
    usage = [{"prompt_tokens": 3, "completion_tokens": n} for n in (1, 2, 4)]
    replica = _CannedReplica(200, _sse([
        {"choices": [{"text": ""}], "usage": usage[0]},  # a token without text
        {"choices": [{"text": "x"}], "usage": usage[1]},
        {"choices": [{"text": "yz"}], "usage": usage[2]},  # two tokens in one chunk
        {"choices": [], "usage": {**usage[2], "prompt_tokens_details": {"cached_tokens": 0}}},
    ]))
    timing = _time(replica)
    # clock: sent at 0.01; tokens read at 0.02 (1 token), 0.03 (2), 0.04 (4); ended at 0.05
    assert (timing.prompt_tokens, timing.cached_tokens, timing.completion_tokens) == (3, 0, 4)
    assert timing.ttft == pytest.approx(0.01)
    assert timing.tpot == pytest.approx(0.02 / 3)  # 3 tokens after the first in 20 ms
    (sent,) = replica.sent
    assert sent["prompt"] == "a b c" and sent["max_tokens"] == 4 and sent["temperature"] == 0.0
    assert sent["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert sent["ignore_eos"] is True


def test_a_failed_or_empty_stream_raises() -> None:
    with pytest.raises(CalibrationProbeError, match="HTTP 503: busy"):
        _time(_CannedReplica(503, b"busy"))
    with pytest.raises(CalibrationProbeError, match="without content"):
        _time(_CannedReplica(200, _sse([])))


# -- contended samples ----------------------------------------------------------------


def _trial(tpot: float, foreign: float | None) -> DecodeSample:
    core = None if foreign is None else CoreShare(target=1 - foreign, foreign=foreign)
    return DecodeSample(batch=4, repeat=0, tpots=(tpot,), core=core)


def test_contended_samples_are_left_out_of_the_median() -> None:
    trials = [_trial(0.020, 0.0), _trial(0.021, 0.1), _trial(0.045, 0.6), _trial(0.019, 0.05)]
    [point] = summarise(ProbeResults((), tuple(trials)), max_foreign=0.25)
    assert (point.value, point.samples, point.discarded) == (0.020, 3, 1)
    [everything] = summarise(ProbeResults((), tuple(trials)))
    assert everything.value == pytest.approx(0.0205) and everything.discarded == 0


def test_a_point_with_too_few_quiet_samples_keeps_its_least_contended_half() -> None:
    trials = [_trial(0.05, 0.5), _trial(0.03, 0.3), _trial(0.04, 0.4), _trial(0.02, 0.1)]
    assert [t.tpot for t in quiet(trials, 0.25)] == [0.02, 0.03]
    assert quiet([_trial(0.05, None)], 0.25) == [_trial(0.05, None)]  # nothing to judge by


def test_the_core_meter_separates_the_target_from_other_processes(tmp_path: Path) -> None:
    def write(core0: tuple[int, ...], target_ticks: int, other_ticks: int) -> CoreReading:
        (tmp_path / "stat").write_text(
            "cpu  1 1 1 1 1 0 0 0 0 0\n"
            f"cpu0 {' '.join(map(str, core0))} 0 0\ncpu1 9 9 9 9 9 0 0 0 0 0\n")
        for pid, pgrp, ticks in ((10, 10, target_ticks), (11, 10, 0), (20, 20, other_ticks)):
            (tmp_path / str(pid)).mkdir(exist_ok=True)
            (tmp_path / str(pid) / "stat").write_text(
                f"{pid} (vllm (engine)) S 1 {pgrp} {pgrp} 0 -1 0 0 0 0 0 {ticks} 0 0 0\n")
        return CoreMeter(0, 10, proc=tmp_path).read()

    # user nice system idle iowait irq softirq steal
    before = write((100, 0, 0, 100, 0, 0, 0, 0), 50, 0)
    after = write((170, 0, 10, 120, 0, 0, 0, 0), 110, 20)  # 100 ticks: 80 busy, 60 ours
    share = CoreMeter.share(before, after)
    assert share is not None
    assert (share.target, share.foreign) == pytest.approx((0.6, 0.2))
