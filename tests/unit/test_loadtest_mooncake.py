"""Mooncake trace parsing and replay: equal hash ids give equal prefixes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest.workloads.mooncake import (
    MooncakeParams,
    TraceRecord,
    build,
    build_from_records,
    default_trace_path,
    in_sample,
    parse_trace,
    prompt_text,
    resolve_trace,
)

LINES = [
    {"timestamp": 0, "input_length": 1100, "output_length": 10, "hash_ids": [1, 2, 3]},
    {"timestamp": 500, "input_length": 1536, "output_length": 400, "hash_ids": [1, 2, 4]},
    {"timestamp": 2000, "input_length": 300, "output_length": 3, "hash_ids": [9]},
]


def _jsonl(records: list[dict]) -> list[str]:
    return [json.dumps(r) for r in records]


def test_parse_trace_reads_every_field() -> None:
    records = parse_trace(_jsonl(LINES) + [""])
    assert records[1] == TraceRecord(500.0, 1536, 400, (1, 2, 4))
    assert len(records) == 3


def test_parse_trace_names_the_bad_line() -> None:
    with pytest.raises(ValueError, match="line 2"):
        parse_trace([json.dumps(LINES[0]), '{"timestamp": 1}'])


def test_equal_ids_give_equal_prefixes() -> None:
    params = MooncakeParams(length_scale=1 / 16)  # 512-token blocks -> 32 words
    first, second, _ = parse_trace(_jsonl(LINES))
    a, b = prompt_text(first, params).split(), prompt_text(second, params).split()
    assert a[:64] == b[:64]  # hash ids 1, 2
    assert a[64:] != b[64:96]  # hash id 3 vs 4
    assert len(a) == round(1100 / 16)  # the last block is cut to the input length
    assert len(b) == 96


def test_scaling_and_timing() -> None:
    records = parse_trace(_jsonl(LINES))
    params = MooncakeParams(length_scale=1 / 32, time_scale=2.0, output_scale=0.5,
                            max_output_len=100)
    workload = build_from_records(records, params)
    arrivals = [c.arrival for c in workload.conversations]
    assert arrivals == [0.0, 0.25, 1.0]
    assert [c.turns[0].max_tokens for c in workload.conversations] == [5, 100, 2]
    assert workload.pacing.mode == "trace"
    assert workload == build_from_records(records, params)


def test_limit_offset_and_family_sampling() -> None:
    records = parse_trace(_jsonl(LINES))
    limited = build_from_records(records, MooncakeParams(offset=1, limit=1))
    assert [c.id for c in limited.conversations] == ["t1"]
    # A family (first hash id) is kept or dropped whole.
    many = [TraceRecord(float(i), 100, 1, (i % 30, 100 + i)) for i in range(90)]
    kept = [r for r in many if in_sample(r, 3)]
    families = {r.hash_ids[0] for r in kept}
    assert kept and len(kept) < len(many)
    assert all(r in kept for r in many if r.hash_ids[0] in families)


def test_resolve_trace(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(_jsonl(LINES)))
    assert resolve_trace(str(tmp_path)) == trace
    assert resolve_trace(str(trace)) == trace
    workload = build(MooncakeParams(trace=str(tmp_path)))
    assert workload.request_count == 3
    with pytest.raises(FileNotFoundError):
        resolve_trace(str(tmp_path / "missing.jsonl"))


def test_default_trace_is_beside_the_repository() -> None:
    path = default_trace_path()
    assert path.parts[-3:] == ("shared", "data", "mooncake")
    if path.is_dir():
        records = parse_trace(resolve_trace(None).read_text().splitlines()[:50])
        assert len(records) == 50


def test_a_bailian_trace_replays_at_its_pace_in_16_token_blocks() -> None:
    """Alibaba's Bailian (Qwen) traces give seconds and 16 tokens an id: read as
    milliseconds, two hours of traffic would arrive in seven seconds."""
    lines = [{"chat_id": 1, "parent_chat_id": -1, "timestamp": 10.0, "input_length": 30,
              "output_length": 5, "type": "text", "turn": 1, "hash_ids": [7, 8]},
             {"chat_id": 2, "parent_chat_id": 1, "timestamp": 12.5, "input_length": 64,
              "output_length": 5, "type": "text", "turn": 2, "hash_ids": [7, 8, 9, 10]}]
    workload = build_from_records(parse_trace(_jsonl(lines)), MooncakeParams(length_scale=1.0))
    assert [c.arrival for c in workload.conversations] == [0.0, 2.5]
    first, second = (c.turns[0].user.split() for c in workload.conversations)
    assert len(first) == 30 and len(second) == 64  # 16 words an id, the last one cut
    assert first == second[:30]  # ids 7, 8: the same words
    forced = build_from_records(parse_trace(_jsonl(lines)),
                                MooncakeParams(length_scale=1.0, trace_block_tokens=512))
    assert forced.conversations[1].turns[0].user.split()[:40] != second[:40]  # one 512 block


def test_other_trace_files_load_as_replay_reads_them(tmp_path: Path) -> None:
    """A gzip'd, unsorted trace paces by its timestamps (file order had the early ones all
    clamped to the first arrival); a CSV without hash ids gives each request its own prompt
    of its own length (an empty prompt, refused, before)."""
    import gzip

    unsorted = [LINES[2], LINES[0], LINES[1]]
    trace = tmp_path / "t.jsonl.gz"
    trace.write_bytes(gzip.compress("\n".join(_jsonl(unsorted)).encode()))
    workload = build(MooncakeParams(trace=str(trace)))
    assert [c.arrival for c in workload.conversations] == [0.0, 0.5, 2.0]
    assert [c.turns[0].max_tokens for c in workload.conversations] == [10, 256, 3]
    azure = tmp_path / "azure.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                     "2023-11-16 18:15:46.000,1600,10\n2023-11-16 18:15:47.500,1600,8\n")
    workload = build(MooncakeParams(trace=str(azure), length_scale=1 / 16, family_sample=1))
    first, second = (c.turns[0].user.split() for c in workload.conversations)
    assert len(first) == len(second) == 100 and first[:20] != second[:20]
    assert [c.arrival for c in workload.conversations] == [0.0, 1.5]
    assert len({c.group for c in workload.conversations}) == 2
    seconds = tmp_path / "seconds.jsonl"
    seconds.write_text(json.dumps({**LINES[0], "timestamp": 0.5}) + "\n")
    with pytest.raises(ValueError, match="seconds.jsonl: trace line 1: .*milliseconds"):
        build(MooncakeParams(trace=str(seconds)))
