"""The burst workload and its figures: requests per replica per burst, predictions, ejections."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.client import RequestRecord
from loadtest.driver import DriveResult
from loadtest.measure import MeasuredRun
from loadtest.replica_metrics import LoadSample, ReplicaDelta
from loadtest.report import write_outputs
from loadtest.results import ContenderResult
from loadtest.summary import summarize
from loadtest.workloads.registry import build_workload


def test_bursts_are_sent_at_once_each_behind_new_prefixes() -> None:
    workload = build_workload("burst", {"bursts": 2, "burst_size": 6, "prefixes": 2,
                                        "prefix_len": 40, "repeats": 1, "gap": 5.0})
    assert workload.pacing.mode == "trace" and workload.pacing.concurrency == 0
    by_burst: dict[str, list] = {}
    for conversation in workload.conversations:
        by_burst.setdefault(conversation.group, []).append(conversation)
    assert sorted(by_burst) == ["burst-0", "burst-1", "burst-2", "burst-3"]
    for index, group in enumerate(sorted(by_burst)):
        members = by_burst[group]
        assert len(members) == 6 and {c.arrival for c in members} == {index * 5.0}
        assert len({c.system for c in members}) == 2
        assert len({c.turns[0].user for c in members}) == 6
    # a repeat brings the same prefixes back; the next burst new ones
    systems = {g: {c.system for c in by_burst[g]} for g in by_burst}
    assert systems["burst-0"] == systems["burst-1"]
    assert not systems["burst-1"] & systems["burst-2"]


def test_a_burst_larger_than_its_prefixes_is_required() -> None:
    with pytest.raises(ValueError, match="prefixes"):
        build_workload("burst", {"burst_size": 2, "prefixes": 3})


def _burst_run() -> MeasuredRun:
    records = []
    for burst, start in enumerate((0.0, 10.0)):
        for i in range(4):
            records.append(RequestRecord(
                conversation=f"b{burst}-{i}", group=f"burst-{burst}", turn=0,
                sent_at=start + 0.001 * i, ttft=0.1, e2e=0.2, prompt_tokens=100,
                completion_tokens=4, cached_tokens=80, usage_reported=True,
                matched_tokens=72))
    drive = DriveResult(tuple(records), (), 12.0, unsent=0, abandoned=0)
    # the replicas' request counters, sampled: burst 0 went 3/1, burst 1 went 2/2
    load = (LoadSample(0.0, (0.0, 0.0), (10.0, 20.0)),
            LoadSample(5.0, (0.0, 0.0), (13.0, 21.0)),
            LoadSample(10.0, (0.0, 0.0), (13.0, 21.0)),
            LoadSample(15.0, (0.0, 0.0), (15.0, 23.0)))
    replicas = (ReplicaDelta("http://a", 400, 500, 5, 500),
                ReplicaDelta("http://b", 240, 300, 3, 300))
    return MeasuredRun("prefixgate:prefix", "burst", ("http://a", "http://b"), drive,
                       replicas, load, ejections=0.0)


def test_per_burst_shares_predictions_and_ejections(tmp_path: Path) -> None:
    summary = summarize(_burst_run())
    assert summary.bursts == [[3, 1], [2, 2]]
    assert summary.burst_max_mean == pytest.approx(1.5)
    assert summary.predicted_ratio == pytest.approx(0.9)
    assert summary.ejections == 0.0
    paths = write_outputs(tmp_path, {"command": "x"},
                          [ContenderResult("prefixgate:prefix", run=_burst_run())], None, "t")
    text = paths["md"].read_text()
    assert "### Bursts" in text
    assert "| prefixgate:prefix | 1.50 | 3/1 · 2/2 | 640 | 0.90 | 0 |" in text
