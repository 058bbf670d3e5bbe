"""prefixgate replay and fit: synthetic prompts that share what the trace shared, the
replay on simulated engines, the search for N, the fit from vLLM metrics, the CLI.

No sockets: engines are stepped in simulated time; "live" metrics come from the
simulator's own vLLM metrics inside the replay (``readings_every_s``).
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
from dataclasses import replace
from pathlib import Path

import pytest

from engine.sim.cli import build_parser, config_from_args, parse_args
from engine.sim.latency import LatencyModel, LatencyModelError, LatencyParams
from gateway.replay import cli as replay_cli
from gateway.replay import fit_cli
from gateway.replay.capacity import CapacityChoice, CapacityError, resolve_capacity
from gateway.replay.fit import fit_latency, windows
from gateway.replay.fleet import FleetSpec, replay, replay_with_readings
from gateway.replay.outcome import ReplayOutcome
from gateway.replay.plot import draw
from gateway.replay.report import answer_line
from gateway.replay.scrape import Reading
from gateway.replay.search import Question, Replays, smallest_meeting
from gateway.replay.workload import ReplayItem, Workload, build_workload, nearest_rank
from gateway.trace.format import TraceLine

from .test_kv_plan import QWEN25_72B

TRUE = LatencyParams(step_overhead_s=0.012, prefill_per_token_s=4e-5, decode_per_seq_s=0.0015)


def model(params: LatencyParams = TRUE, blocks: int = 4096, batched: int = 2048) -> LatencyModel:
    return LatencyModel(params, block_size=16, num_blocks=blocks, max_num_batched_tokens=batched)


def spec(replicas: int, **fields: object) -> FleetSpec:
    values: dict[str, object] = {"replicas": replicas, "latency": model(), "num_blocks": 4096,
                                 "block_size": 16}
    values.update(fields)
    return FleetSpec(**values)  # type: ignore[arg-type]


def conversations(groups: int = 12, turns: int = 6, rate: float = 2.0, seed: int = 0,
                  system_blocks: int = 40) -> Workload:
    """Chats: each group shares a system prompt; each turn extends its conversation."""
    rng = random.Random(seed)
    lines, now = [], 0.0
    history: dict[int, list[int]] = {}
    for _ in range(groups * turns):
        now += rng.expovariate(rate)
        group = rng.randrange(groups)
        ids = history.setdefault(group, [group * 10_000 + i for i in range(system_blocks)])
        ids += [rng.getrandbits(50) for _ in range(rng.randint(2, 8))]
        lines.append(TraceLine(timestamp_ms=int(now * 1000), input_length=len(ids) * 16 + 7,
                               output_length=rng.randint(8, 40), hash_ids=tuple(ids),
                               block_size=16, model="m", replica=f"s{group % 2}",
                               policy="prefix", ttft_ms=50.0, cached_tokens=16 * len(ids) // 2))
    return build_workload(lines)


# -- synthetic prompts ---------------------------------------------------------------


def test_equal_ids_give_equal_tokens_and_the_engine_hits_exactly_the_shared_blocks() -> None:
    items = (ReplayItem(0, 0.0, 16 * 5 + 3, 4, (1, 2, 3, 4, 5)),
             ReplayItem(1, 1.0, 16 * 5 + 9, 4, (1, 2, 3, 9, 9)))
    workload = Workload(items, trace_block=16, model="m")
    a, b = workload.prompt(items[0]), workload.prompt(items[1])
    assert len(a) == 83 and len(b) == 89
    assert a[:48] == b[:48] and a[48:64] != b[48:64]
    assert a[80:] != b[80:83]  # the tails are each request's own
    first = list(workload.engine_hashes(items[0], 16, a))
    second = list(workload.engine_hashes(items[1], 16, b))
    assert first[:3] == second[:3] and first[3] != second[3]
    # the gateway's chain agrees on the same prefix, in its own key space
    route_a, route_b = workload.route_hashes(items[0], 16), workload.route_hashes(items[1], 16)
    assert list(route_a[:3]) == list(route_b[:3]) and route_a[3] != route_b[3]
    assert not set(route_a) & set(first)


def test_a_mooncake_block_of_512_is_32_engine_blocks_of_16() -> None:
    items = (ReplayItem(0, 0.0, 1024, 1, (7, 8)), ReplayItem(1, 0.0, 1000, 1, (7, 9)))
    workload = Workload(items, trace_block=512, model="m")
    a = workload.engine_hashes(items[0], 16, workload.prompt(items[0]))
    b = workload.engine_hashes(items[1], 16, workload.prompt(items[1]))
    assert len(a) == 64 and len(b) == 62
    assert list(a[:32]) == list(b[:32]) and a[32] != b[32]


def test_nearest_rank_is_the_p99_a_reader_expects() -> None:
    values = [float(v) for v in range(1, 101)]
    assert nearest_rank(values, 0.99) == 99.0 and nearest_rank(values, 0.5) == 50.0
    assert nearest_rank([3.0], 0.99) == 3.0


# -- the replay ----------------------------------------------------------------------


def test_cache_aware_routing_beats_round_robin_on_hit_rate_and_ttft() -> None:
    workload = conversations()
    prefix = replay(workload, spec(4, policy="prefix"))
    spread = replay(workload, spec(4, policy="round_robin"))
    assert prefix.completed == spread.completed == len(workload)
    assert prefix.hit_rate > spread.hit_rate + 0.2
    assert prefix.ttft_p50_s is not None and spread.ttft_p50_s is not None
    assert prefix.ttft_p50_s < spread.ttft_p50_s
    assert sum(load.requests for load in prefix.loads) == len(workload)
    assert prefix.reasons.get("hit", 0) > 0


def test_precise_learns_from_the_engines_kv_events() -> None:
    workload = conversations()
    precise = replay(workload, spec(4, policy="precise"))
    prefix = replay(workload, spec(4, policy="prefix"))
    assert precise.hit_rate > 0.5
    assert precise.hit_rate == pytest.approx(prefix.hit_rate, abs=0.1)


def test_more_replicas_lower_the_tail_and_a_sure_miss_stops_early() -> None:
    workload = conversations(rate=30.0, groups=20, turns=8)
    one = replay(workload, spec(1))
    four = replay(workload, spec(4))
    assert one.ttft_p99_s is not None and four.ttft_p99_s is not None
    assert four.ttft_p99_s < one.ttft_p99_s / 2
    limit = four.ttft_p99_s * 1.5
    stopped = replay(workload, spec(1, ttft_limit_s=limit))
    assert stopped.stopped and stopped.meets is False
    assert stopped.completed < one.completed
    assert replay(workload, spec(4, ttft_limit_s=limit)).meets is True


def test_recorded_routing_sends_each_request_where_it_was_served() -> None:
    workload = conversations()
    outcome = replay(workload, spec(2, policy="recorded"))
    by_id = {load.id: load.requests for load in outcome.loads}
    recorded = {r: sum(1 for i in workload.items if i.replica == r) for r in ("s0", "s1")}
    assert by_id == recorded


def test_a_request_longer_than_the_kv_cache_is_refused_not_stuck() -> None:
    items = (ReplayItem(0, 0.0, 5000, 10, ()), ReplayItem(1, 0.1, 100, 10, ()))
    outcome = replay(Workload(items, 16, "m"), spec(1, num_blocks=128))
    assert outcome.rejected == 1 and outcome.completed == 1


def test_a_replica_caches_in_all_but_vllms_null_block() -> None:
    # vLLM refuses a context longer than (num_gpu_blocks - 1) * block_size: one block
    # of num_gpu_blocks is its null block. A replay of --blocks N does the same.
    fits = ReplayItem(0, 0.0, 7 * 16 - 10, 10, ())
    too_long = ReplayItem(1, 0.1, 8 * 16 - 10, 10, ())
    outcome = replay(Workload((fits, too_long), 16, "m"), spec(1, num_blocks=8))
    assert outcome.rejected == 1 and outcome.completed == 1
    with pytest.raises(ValueError, match="null block"):
        spec(1, num_blocks=1)


# -- the search ----------------------------------------------------------------------


class _Scripted(Replays):
    """Replays whose verdict is scripted: meets from ``needed`` replicas on."""

    def __init__(self, needed: int, jobs: int = 1) -> None:
        self.needed = needed
        self.jobs = jobs
        self.asked: list[list[int]] = []
        self.real = replay(conversations(groups=2, turns=2), spec(1))

    def run(self, counts: list[int]) -> dict[int, ReplayOutcome]:  # type: ignore[override]
        self.asked.append(sorted(counts))
        return {n: replace(self.real, replicas=n, ttft_limit_s=1.0,
                           ttft_q_s=0.5 if n >= self.needed else 2.0) for n in counts}


@pytest.mark.parametrize("needed", [1, 2, 5, 13, 64])
@pytest.mark.parametrize("jobs", [1, 3])
def test_the_search_finds_the_smallest_count_in_few_replays(needed: int, jobs: int) -> None:
    replays = _Scripted(needed, jobs)
    result = smallest_meeting(Question(1.0, max_replicas=64), replays)
    assert result.answer == needed
    assert result.outcomes[needed].meets
    assert all(not result.outcomes[n].meets for n in result.outcomes if n < needed)
    assert sum(len(round_) for round_ in replays.asked) <= 14


def test_the_search_says_when_no_count_is_enough() -> None:
    result = smallest_meeting(Question(1.0, max_replicas=10), _Scripted(11))
    assert result.answer is None and max(result.outcomes) == 10


def test_the_answer_line_says_which_counts_missed_when_they_were_given() -> None:
    question = Question(1.0, max_replicas=64)
    searched = smallest_meeting(question, _Scripted(65)).outcomes
    assert answer_line(question, None, searched) == (
        "answer: no replica count up to 64 keeps TTFT p99 under 1.00 s")
    given = _Scripted(65).run([20, 22])  # --replicas 20,22 --ttft-p99 1
    assert answer_line(question, None, given) == (
        "answer: none of the counts replayed (20, 22) keeps TTFT p99 under 1.00 s")


def test_the_search_in_worker_processes_agrees_with_one_process() -> None:
    workload = conversations(rate=30.0, groups=20, turns=8)
    four = replay(workload, spec(4))
    assert four.ttft_p99_s is not None
    question = Question(four.ttft_p99_s * 1.2, max_replicas=16)
    template = spec(1, ttft_limit_s=question.ttft_limit_s)
    with Replays(workload, template, jobs=1) as alone:
        one = smallest_meeting(question, alone)
    fresh = conversations(rate=30.0, groups=20, turns=8)  # hashed once, before the fork
    with Replays(fresh, template, jobs=2) as pool:
        two = smallest_meeting(question, pool)
    assert one.answer == two.answer and one.answer is not None and one.answer <= 4
    for item in workload.items:  # what the workers inherited is what one process computes
        assert fresh.route_hashes(item, 16) == workload.route_hashes(item, 16)
        assert fresh.engine_hashes(item, 16, ()) == workload.engine_hashes(item, 16, ())
    for n in set(one.outcomes) & set(two.outcomes):
        assert one.outcomes[n].ttft_q_s == two.outcomes[n].ttft_q_s


# -- KV capacity -----------------------------------------------------------------------


def test_capacity_from_a_profile_and_fp8_doubles_it(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(QWEN25_72B))
    bf16 = resolve_capacity(CapacityChoice(profile="qwen2.5-72b-tp4", model_config=str(config)),
                            16, 1)
    fp8 = resolve_capacity(CapacityChoice(profile="qwen2.5-72b-tp4", model_config=str(config),
                                          kv_cache_dtype="fp8"), 16, 1)
    assert bf16.blocks > 1000 and fp8.blocks == pytest.approx(2 * bf16.blocks, rel=0.02)
    assert resolve_capacity(CapacityChoice(blocks=77), 16, 1).blocks == 77
    assert resolve_capacity(CapacityChoice(), 16, 123).blocks == 123
    with pytest.raises(CapacityError, match="model-config"):
        resolve_capacity(CapacityChoice(profile="qwen2.5-72b-tp4"), 16, 1)


# -- the fit -------------------------------------------------------------------------


def varied_load(seed: int = 1) -> Workload:
    """Six minutes of single prompts at rates from quiet to busy."""
    rng = random.Random(seed)
    items: list[ReplayItem] = []
    now = 0.0
    for rate in (0.2, 0.5, 1.0, 0.3, 1.5, 0.7):
        end = now + 60
        while now < end:
            now += rng.expovariate(rate)
            length = rng.randint(50, 3000)
            items.append(ReplayItem(len(items), now, length, rng.randint(10, 200),
                                    tuple(rng.getrandbits(50) for _ in range(length // 16))))
    return Workload(tuple(items), 16, "m")


@pytest.mark.parametrize("true", [TRUE, LatencyParams(0.03, 2e-5, 0.004),
                                  LatencyParams(0.004, 1e-4, 0.0003)])
def test_the_fit_from_vllm_metrics_predicts_what_the_true_model_does(
        true: LatencyParams) -> None:
    workload = varied_load()
    truth = spec(1, latency=model(true, blocks=20000), num_blocks=20000, readings_every_s=5.0)
    measured, readings = replay_with_readings(workload, truth)
    assert len(windows("r0", readings["r0"])) > 20
    fit = fit_latency(readings, max_num_batched_tokens=2048)
    assert fit.model.block_size == 16 and fit.model.num_blocks == 20000
    assert fit.model.params.step_overhead_s == pytest.approx(true.step_overhead_s, rel=0.3)
    assert fit.model.params.prefill_per_token_s == pytest.approx(true.prefill_per_token_s,
                                                                 rel=0.3)
    predicted = replay(workload, spec(1, latency=fit.model, num_blocks=20000))
    for name in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s"):
        assert getattr(predicted, name) == pytest.approx(getattr(measured, name), rel=0.2), name


def test_fit_from_saved_readings_writes_a_model_the_simulator_takes(tmp_path: Path) -> None:
    _, readings = replay_with_readings(varied_load(), spec(
        1, latency=model(blocks=20000), num_blocks=20000, readings_every_s=5.0))
    saved = tmp_path / "readings.jsonl"
    fit_cli.save_readings(readings, saved)
    out = tmp_path / "model.json"
    lines: list[str] = []

    class Out:
        def write(self, text: str) -> None:
            lines.append(text)

    assert fit_cli.run(["--readings", str(saved), "--out", str(out),
                        "--max-num-batched-tokens", "2048"], Out(), Out()) == 0  # type: ignore[arg-type]
    fitted = LatencyModel.read(out)
    assert fitted.max_num_batched_tokens == 2048
    assert "prefixgate sim --step-overhead" in "".join(lines)
    config = config_from_args(parse_args(build_parser(), ["--latency-model", str(out),
                                                          "--block-size", "32"]))
    assert config.step_overhead_s == fitted.params.step_overhead_s
    assert (config.block_size, config.num_blocks) == (32, fitted.num_blocks)


def test_time_outside_the_steps_is_fitted_and_added_to_every_ttft() -> None:
    # The replicas' TTFT is their queue and prefill time plus the serving front (none in
    # the simulator); the gateway's trace adds its own part. A replay adds the sum.
    workload = varied_load()
    truth = spec(1, latency=model(blocks=20000), num_blocks=20000, readings_every_s=5.0)
    _, readings = replay_with_readings(workload, truth)
    plain = fit_latency(readings, max_num_batched_tokens=2048)
    # ~0: prefill time is observed when a request ends, TTFT at its first token, so a
    # window can hold one without the other.
    assert plain.front_s == pytest.approx(0.0, abs=1e-3) and plain.gateway_s is None
    replicas_ttft = plain.check()["mean_ttft_s"]
    assert replicas_ttft
    fit = fit_latency(readings, max_num_batched_tokens=2048, gateway_ttft_s=replicas_ttft + 0.04)
    assert fit.gateway_s == pytest.approx(0.04)
    assert fit.model.request_overhead_s == pytest.approx(0.04 + fit.front_s)
    assert LatencyModel.from_dict(fit.model.as_dict()) == fit.model
    without = replay(workload, spec(1, latency=plain.model, num_blocks=20000))
    with_it = replay(workload, spec(1, latency=fit.model, num_blocks=20000))
    added = fit.model.request_overhead_s - plain.model.request_overhead_s
    for name in ("ttft_p50_s", "ttft_p99_s", "ttft_mean_s"):
        assert getattr(with_it, name) == pytest.approx(getattr(without, name) + added), name
    assert (with_it.hit_rate, with_it.tpot_p50_s) == (without.hit_rate, without.tpot_p50_s)


def test_the_gateways_ttft_is_read_from_the_trace_lines_of_the_readings_span(
        tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    lines = [TraceLine(at_ms, 100, 5, (), 16, ttft_ms=ttft)
             for at_ms, ttft in ((999_000, 900.0), (1_000_500, 100.0), (1_009_000, 300.0),
                                 (1_011_000, 900.0))]
    trace.write_bytes(b"".join(line.encode() for line in lines))
    readings = {"r0": [Reading(1000.0, {}), Reading(1010.0, {})]}
    assert fit_cli.gateway_ttft([trace], readings) == pytest.approx(0.2)
    assert fit_cli.gateway_ttft([trace], {"r0": []}) is None


def test_sigterm_ends_a_live_fit_as_ctrl_c_does() -> None:
    # A job runner (or the validation harness) stops `prefixgate fit` with SIGTERM: the
    # readings so far are kept and fitted, not lost with the process.
    logged: list[str] = []

    def terminated(seconds: float) -> None:
        os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    with fit_cli.sigterm_interrupts():
        readings = fit_cli.read_replicas([], duration=3600, interval=1.0, api_key=None,
                                         log=logged.append, sleep=terminated)
    assert readings == {} and any("interrupted" in line for line in logged)
    assert signal.getsignal(signal.SIGTERM) == before


def test_the_plot_ticks_every_count_replayed_labels_them_apart_and_marks_the_answer(
        tmp_path: Path) -> None:
    # A search's counts, as the Mooncake replay's: doublings, then a bisection of 16-32.
    series = [(n, None, None, True) for n in (1, 2, 4, 8, 16, 20, 21)] + [
        (n, 9.0 - n / 100, 0.15, False) for n in (22, 24, 32)]
    figure = draw(series, Question(10.0), tmp_path / "n.png", "t", answer=22)
    axes = figure.axes[0]
    labelled = [tick for tick in axes.get_xticks() if 0 <= tick <= 32]
    assert all(b - a >= 2 for a, b in itertools.pairwise(labelled))
    assert {n for n, *_ in series} <= {round(t) for t in
                                       [*axes.get_xticks(), *axes.get_xticks(minor=True)]}
    legend = axes.get_legend()
    assert legend is not None
    assert "answer: 22 replicas" in [text.get_text() for text in legend.get_texts()]
    assert (tmp_path / "n.png").stat().st_size > 1000


# -- the command ---------------------------------------------------------------------


def test_the_command_answers_the_n_question_in_text_json_and_a_plot(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.jsonl"
    workload = conversations(rate=30.0, groups=20, turns=8)
    with trace.open("wb") as handle:
        for item in workload.items:
            handle.write(TraceLine(int(item.arrival * 1000), item.input_length,
                                   item.output_length, item.hash_ids, 16, model="m",
                                   replica=item.replica, policy="prefix").encode())
    latency = tmp_path / "model.json"
    model().write(latency)
    plot, out = tmp_path / "n.png", tmp_path / "replay.json"
    code = replay_cli.main([str(trace), "--latency-model", str(latency), "--ttft-p99", "0.8",
                            "--max-replicas", "16", "--plot", str(plot), "--out", str(out),
                            "--no-progress"])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "answer:" in text and "replica(s) keep TTFT p99 under 800 ms" in text
    document = json.loads(out.read_text())
    answer = document["answer"]
    by_n = {r["replicas"]: r for r in document["replays"]}
    assert by_n[answer]["meets"] and by_n[answer]["ttft_q_s"] < 0.8
    assert all(not by_n[n]["meets"] for n in by_n if n < answer)
    assert plot.stat().st_size > 1000
    assert replay_cli.main([str(trace), "--latency-model", str(latency), "--replicas", "2",
                            "--json", "--speed", "2"]) == 0
    twice = json.loads(capsys.readouterr().out)
    assert twice["speed"] == 2 and twice["replays"][0]["replicas"] == 2
    assert replay_cli.main([str(tmp_path / "missing.jsonl")]) == 2


def test_the_documented_glob_takes_the_rotated_files_and_not_the_key_beside_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``prefixgate replay trace.jsonl*`` (the docs' command) also matched the secret the
    gateway keeps in ``trace.jsonl.key``, and stopped on "trace line 1" of no named file."""
    from gateway.trace.writer import load_secret
    trace = tmp_path / "trace.jsonl"
    items = conversations(rate=30.0, groups=4, turns=4).items
    for path, part in ((tmp_path / "trace.jsonl.1", items[:8]), (trace, items[8:])):
        with path.open("wb") as handle:
            for item in part:
                handle.write(TraceLine(int(item.arrival * 1000), item.input_length,
                                       item.output_length, item.hash_ids, 16).encode())
    load_secret(None, trace)  # what a recording gateway writes beside its trace
    latency = tmp_path / "model.json"
    model().write(latency)
    files = sorted(str(p) for p in tmp_path.glob("trace.jsonl*"))
    assert len(files) == 3
    assert replay_cli.main([*files, "--latency-model", str(latency), "--replicas", "2",
                            "--json", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["replays"][0]["requests"] == len(items)
    broken = tmp_path / "broken.jsonl"
    broken.write_text("not a trace line\n")
    assert replay_cli.main([str(broken), "--latency-model", str(latency)]) == 2
    assert f"{broken}: trace line 1" in capsys.readouterr().err


def test_a_latency_model_without_its_parameters_is_refused_by_their_names(
        tmp_path: Path) -> None:
    path = tmp_path / "model.json"
    path.write_text(json.dumps({"format": "prefixgate-latency-model/1",
                                "step_overhead_s": 0.01}), encoding="utf-8")
    with pytest.raises(LatencyModelError) as refused:
        LatencyModel.read(path)
    assert "no prefill_per_token_s, decode_per_seq_s" in str(refused.value)
    assert "KeyError" not in str(refused.value)
