"""The simulated engine: batching, queueing, the latency model, preemption, aborts."""

from __future__ import annotations

import asyncio

import pytest

from engine.sim.cache import PrefixCache
from engine.sim.config import SimConfig
from engine.sim.request import EngineRequest, Status, TokenEvent
from engine.sim.scheduler import Engine
from engine.sim.textgen import OutputSpec, OutputText


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    """An ``EngineObserver`` that keeps the last gauges and counts events."""

    def __init__(self) -> None:
        self.running = self.waiting = 0
        self.max_waiting = 0
        self.usage = 0.0
        self.hits = self.queries = self.preemptions = 0
        self.finished: list[str] = []

    def on_step(self, running: int, waiting: int, kv_usage: float, scheduled_tokens: int) -> None:
        self.running, self.waiting, self.usage = running, waiting, kv_usage
        self.max_waiting = max(self.max_waiting, waiting)

    def on_admitted(
        self, request: EngineRequest, queried: int, hit: int, first_admission: bool
    ) -> None:
        self.queries += queried
        self.hits += hit

    def on_token(self, request: EngineRequest, now: float) -> None:
        pass

    def on_finished(self, request: EngineRequest, reason: str, now: float) -> None:
        self.finished.append(reason)

    def on_preempted(self, request: EngineRequest) -> None:
        self.preemptions += 1


def make_engine(**overrides: object) -> tuple[Engine, Recorder]:
    settings: dict[str, object] = {"block_size": 16, "num_blocks": 64, "max_model_len": 1024}
    settings.update(overrides)
    config = SimConfig(**settings)  # type: ignore[arg-type]
    recorder = Recorder()
    engine = Engine(
        config, PrefixCache(config.num_blocks, config.block_size), recorder, wall_clock=FakeClock()
    )
    return engine, recorder


def make_request(
    engine: Engine, prompt: list[int], max_tokens: int = 4, name: str = "r"
) -> EngineRequest:
    events: list[TokenEvent] = []
    spec = OutputSpec(max_tokens=max_tokens, ignore_eos=True)
    output = OutputText(spec, prompt, 0, 0, 1, 8)
    request = EngineRequest(name, 0, prompt, output, events.append, max_tokens=max_tokens)
    engine.add(request)
    return request


def run_until_done(engine: Engine, limit: int = 10_000) -> None:
    for _ in range(limit):
        if not engine.has_work:
            return
        engine.step()
    raise AssertionError("engine did not drain")


def ttft(request: EngineRequest) -> float:
    assert request.first_token_time is not None
    return request.first_token_time - request.arrival_time


def test_a_request_prefills_then_decodes_one_token_per_step() -> None:
    engine, recorder = make_engine()
    request = make_request(engine, list(range(40)), max_tokens=3)
    engine.step()
    assert request.num_output_tokens == 1  # the prefill step samples the first token
    engine.step()
    engine.step()
    assert request.status is Status.FINISHED and request.num_output_tokens == 3
    assert recorder.finished == ["length"] and recorder.usage == 0.0


def test_requests_beyond_max_num_seqs_wait() -> None:
    engine, recorder = make_engine(max_num_seqs=2)
    requests = [make_request(engine, [i] * 20, name=f"r{i}") for i in range(4)]
    engine.step()
    assert (recorder.running, recorder.waiting) == (2, 2)
    run_until_done(engine)
    assert all(request.status is Status.FINISHED for request in requests)
    assert ttft(requests[3]) > ttft(requests[0])  # queued behind the first two


def test_a_request_the_next_step_admits_is_never_reported_waiting() -> None:
    # vLLM reports its queue after scheduling: a request that arrives and is
    # admitted at the next step does not show in vllm:num_requests_waiting
    # (a router reading the gauge would take it for a queue).
    engine, recorder = make_engine(max_num_seqs=2)
    first = make_request(engine, [1] * 20, max_tokens=4, name="a")
    engine.step()
    make_request(engine, [2] * 20, max_tokens=4, name="b")  # arrives between steps
    assert recorder.max_waiting == 0
    run_until_done(engine)
    assert recorder.max_waiting == 0 and first.status is Status.FINISHED
    # Beyond max_num_seqs the queue is real and is reported.
    for i in range(3):
        make_request(engine, [i + 3] * 20, max_tokens=4, name=f"c{i}")
    engine.step()
    assert recorder.waiting == 1


def test_requests_that_cannot_get_blocks_wait() -> None:
    # 16 blocks of 16 tokens; each prompt needs 8 blocks (plus growth).
    engine, recorder = make_engine(num_blocks=16, max_model_len=256)
    for i in range(3):
        make_request(engine, [i + 1] * 120, max_tokens=8, name=f"r{i}")
    engine.step()
    assert recorder.waiting >= 1 and recorder.running <= 2
    run_until_done(engine)
    assert recorder.finished == ["length"] * 3


def test_modeled_ttft_grows_with_uncached_prompt_tokens() -> None:
    short_engine, _ = make_engine()
    long_engine, _ = make_engine()
    short = make_request(short_engine, list(range(32)))
    long = make_request(long_engine, list(range(900)))
    run_until_done(short_engine)
    run_until_done(long_engine)
    config = short_engine.config
    assert ttft(long) - ttft(short) == pytest.approx((900 - 32) * config.prefill_per_token_s)


def test_a_repeated_prompt_hits_the_cache_and_starts_sooner() -> None:
    engine, recorder = make_engine()
    prompt = list(range(500))
    first = make_request(engine, prompt, name="a")
    run_until_done(engine)
    second = make_request(engine, prompt, name="b")
    run_until_done(engine)
    assert second.num_cached_tokens == 496  # (500 - 1) // 16 blocks of 16
    assert recorder.hits == 496 and recorder.queries == 1000
    assert ttft(second) < ttft(first)


def test_requests_admitted_in_one_step_share_the_prefix_the_first_computes() -> None:
    """As vLLM's allocate_slots registers a request's blocks before the next request of
    the same scheduling pass looks up its own: a burst of one prefix pays one prefill."""
    engine, recorder = make_engine(num_blocks=256)
    shared = list(range(1, 65))
    for i in range(4):
        make_request(engine, shared + [1000 + i] * 8, name=f"r{i}")
    step = engine.schedule()
    assert len(step.work) == 4
    assert recorder.hits == 3 * 64                  # the last three found the first's 64
    assert step.prefill_tokens == 64 + 4 * 8        # the prefix computed once
    run_until_done(engine)


def test_long_prompts_are_prefilled_in_chunks_of_the_token_budget() -> None:
    engine, _ = make_engine(max_num_batched_tokens=256)
    request = make_request(engine, list(range(600)))
    steps = 0
    while request.first_token_time is None:
        engine.step()
        steps += 1
    assert steps == 3  # 256 + 256 + 88


def test_only_the_chunk_that_ends_a_prompt_pays_for_a_sampled_sequence() -> None:
    # Sampling and output handling are per sequence that gets a token: every decoding one,
    # and the prompt whose last chunk the step computes (vLLM samples it there).
    engine, _ = make_engine(max_num_batched_tokens=256, decode_per_seq_s=0.01)
    make_request(engine, list(range(600)), max_tokens=2)
    config = engine.config
    steps = [engine.schedule()]
    engine.finish(steps[0])
    while engine.has_work:
        steps.append(engine.schedule())
        engine.finish(steps[-1])
    assert [s.sampling_seqs for s in steps] == [0, 0, 1, 1]
    assert steps[0].duration == pytest.approx(config.step_overhead_s
                                              + 256 * config.prefill_per_token_s)
    assert steps[2].duration == pytest.approx(config.step_overhead_s
                                              + 88 * config.prefill_per_token_s + 0.01)


def test_decode_steps_get_slower_with_a_bigger_batch() -> None:
    engine, _ = make_engine()
    one = engine.step_duration(prefill_tokens=0, sampling_seqs=1)
    many = engine.step_duration(prefill_tokens=0, sampling_seqs=64)
    assert many - one == pytest.approx(63 * engine.config.decode_per_seq_s)


def test_a_full_cache_preempts_the_newest_request_which_then_finishes() -> None:
    engine, recorder = make_engine(num_blocks=8, max_model_len=128)
    first = make_request(engine, [1] * 48, max_tokens=60, name="a")
    second = make_request(engine, [2] * 48, max_tokens=60, name="b")
    run_until_done(engine)
    assert recorder.preemptions >= 1
    assert first.status is Status.FINISHED and second.status is Status.FINISHED
    assert second.num_output_tokens == 60
    assert engine.cache.num_free_blocks == 8


def test_abort_frees_the_blocks_of_a_running_request() -> None:
    engine, recorder = make_engine()
    request = make_request(engine, list(range(100)), max_tokens=50)
    engine.step()
    assert engine.cache.num_free_blocks < 64
    engine.abort(request)
    assert engine.cache.num_free_blocks == 64 and not engine.has_work
    assert recorder.finished == ["abort"]


def test_a_waiting_request_arriving_mid_step_is_stamped_in_model_time() -> None:
    clock = FakeClock()
    config = SimConfig(block_size=16, num_blocks=64, max_model_len=1024, time_scale=10)
    engine = Engine(config, PrefixCache(64, 16), wall_clock=clock)
    clock.now = 1.0  # one wall second idle = ten modeled seconds
    request = make_request(engine, [1, 2, 3])
    assert request.arrival_time == 10.0


async def test_the_loop_serves_requests_and_stops_when_cancelled() -> None:
    clock = FakeClock()
    slept: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.now += seconds
        await asyncio.sleep(0)

    config = SimConfig(block_size=16, num_blocks=64, max_model_len=1024, time_scale=4)
    engine = Engine(config, PrefixCache(64, 16), wall_clock=clock, sleep=fake_sleep)
    task = asyncio.create_task(engine.run())
    done = asyncio.Event()
    output = OutputText(OutputSpec(max_tokens=3, ignore_eos=True), [1], 0, 0, 1, 8)

    def emit(event: TokenEvent) -> None:
        if event.finish_reason is not None:
            done.set()

    engine.add(EngineRequest("loop", 0, list(range(64)), output, emit, max_tokens=3))
    await asyncio.wait_for(done.wait(), timeout=5)
    assert len(slept) == 3
    # The first step computes the prompt and samples its first token; sleeps are divided
    # by time_scale.
    assert slept[0] == engine.step_duration(64, 1) / 4
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    assert task.cancelled()


def test_a_preempted_request_does_not_count_its_recomputation_as_cache_hits() -> None:
    # vLLM 0.32 counts a preempted request's second prefix-cache look-up apart from
    # vllm:prefix_cache_hits/queries; the sim's counters must agree, or a router that
    # piles work onto one replica (many preemptions) looks as if it cached more.
    from prometheus_client import CollectorRegistry

    from engine.sim.metrics import SimMetrics

    config = SimConfig(block_size=16, num_blocks=8, max_model_len=128)
    registry = CollectorRegistry()
    metrics = SimMetrics(config, registry)
    engine = Engine(config, PrefixCache(config.num_blocks, config.block_size), metrics,
                    wall_clock=FakeClock())
    first = make_request(engine, [1] * 48, max_tokens=60, name="a")
    second = make_request(engine, [2] * 48, max_tokens=60, name="b")
    run_until_done(engine)

    def value(name: str) -> float:
        found = registry.get_sample_value(name, {"model_name": config.served_model_name,
                                                 "engine": "0"})
        assert found is not None, name
        return found

    assert value("vllm:num_preemptions_total") >= 1
    assert first.status is Status.FINISHED and second.status is Status.FINISHED
    assert value("vllm:prefix_cache_queries_total") == 96
    assert value("vllm:prefix_cache_hits_total") == 0
