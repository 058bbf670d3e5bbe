"""Trace files users bring: other wrappings (gzip, a byte order mark, CRLF), other public
formats (Azure's and BurstGPT's CSVs), and the mistakes that must be refused by name
rather than replayed wrong (timestamps in seconds, missing fields, a ShareGPT file)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from gateway.replay import cli as replay_cli
from gateway.replay.report import trace_notes
from gateway.replay.workload import build_workload, read_lines
from gateway.trace.files import read_trace
from gateway.trace.format import TraceFormatError, parse_line

MOONCAKE = [
    {"timestamp": 0, "input_length": 1100, "output_length": 10, "hash_ids": [1, 2, 3]},
    {"timestamp": 500, "input_length": 1536, "output_length": 400, "hash_ids": [1, 2, 4]},
    {"timestamp": 2000, "input_length": 300, "output_length": 3, "hash_ids": [9]},
]


def _text(records: list[dict[str, object]], end: str = "\n") -> str:
    return "".join(json.dumps(r) + end for r in records)


def _read(path: Path) -> list[tuple[int, int, int, tuple[int, ...]]]:
    return [(line.timestamp_ms, line.input_length, line.output_length, line.hash_ids)
            for line in read_trace(path)]


EXPECTED = [(0, 1100, 10, (1, 2, 3)), (500, 1536, 400, (1, 2, 4)), (2000, 300, 3, (9,))]


def test_gzip_bom_crlf_and_blank_lines_read_as_the_plain_file(tmp_path: Path) -> None:
    plain = tmp_path / "plain.jsonl"
    plain.write_text(_text(MOONCAKE))
    zipped = tmp_path / "trace.jsonl.gz"
    zipped.write_bytes(gzip.compress(plain.read_bytes()))
    unnamed = tmp_path / "trace-without-suffix"  # told by its bytes, not its name
    unnamed.write_bytes(gzip.compress(plain.read_bytes()))
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    crlf = tmp_path / "crlf.jsonl"
    crlf.write_bytes(("\r\n\r\n" + _text(MOONCAKE, "\r\n\r\n") + "  \r\n").encode())
    for path in (plain, zipped, unnamed, bom, crlf):
        assert _read(path) == EXPECTED, path.name


def test_a_mooncake_trace_in_seconds_is_refused_naming_the_line_not_replayed_1000x_fast(
        tmp_path: Path) -> None:
    seconds = [{**r, "timestamp": r["timestamp"] / 1000 + 0.25} for r in MOONCAKE]  # type: ignore[operator]
    path = tmp_path / "seconds.jsonl"
    path.write_text(_text(seconds))
    with pytest.raises(TraceFormatError, match=r"seconds\.jsonl: trace line 1: timestamp 0\.25 "
                                               r"is not a whole number of milliseconds"):
        read_lines([path])
    # whole floats are milliseconds still, and the gateway's own lines say their block size
    assert parse_line(json.dumps({**MOONCAKE[0], "timestamp": 277.0})).timestamp_ms == 277  # type: ignore[union-attr]


def test_whole_second_timestamps_are_flagged_in_the_report() -> None:
    from gateway.trace.format import TraceLine
    lines = [TraceLine(i, 100, 5, (1,)) for i in range(200)]  # 0, 1, 2 ... "seconds"
    (note,) = trace_notes(build_workload(lines))
    assert "timestamps are seconds" in note
    assert trace_notes(build_workload([TraceLine(i * 1000, 100, 5, (1,)) for i in range(200)])) == ()


@pytest.mark.parametrize(("record", "message"), [
    ({"timestamp": 0, "input_length": 10, "hash_ids": []},
     "trace line 1: no 'output_length' field"),
    ({"timestamp": 0, "input_length": 10, "output_length": None, "hash_ids": []},
     "output_length must be a number, not None"),
    ({"timestamp": "2024-01-01T00:00:00Z", "input_length": 10, "output_length": 1,
      "hash_ids": []}, "timestamp must be a number"),
    ({"timestamp": 0, "input_length": 10.7, "output_length": 1, "hash_ids": []},
     "input_length must be a whole number of tokens"),
    ({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": 5},
     "hash_ids must be a list"),
])
def test_a_bad_field_is_named(tmp_path: Path, record: dict[str, object], message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(_text([record]))
    with pytest.raises(TraceFormatError, match=message):
        read_lines([path])


def test_a_sharegpt_file_or_an_unknown_csv_is_refused_with_the_formats_read(
        tmp_path: Path) -> None:
    sharegpt = tmp_path / "sharegpt.json"
    sharegpt.write_text(json.dumps([{"id": "a", "conversations": [
        {"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}], indent=2))
    with pytest.raises(TraceFormatError, match="sharegpt.json: trace line 1: a JSON document.*ShareGPT"):
        read_lines([sharegpt])
    other = tmp_path / "other.csv"
    other.write_text("time,prompt,completion\n1,2,3\n")
    with pytest.raises(TraceFormatError, match="known CSV header.*Azure"):
        read_lines([other])
    truncated = tmp_path / "cut.jsonl.gz"
    truncated.write_bytes(gzip.compress(_text(MOONCAKE).encode())[:40])
    with pytest.raises(TraceFormatError, match="cut.jsonl.gz: cannot be read"):
        read_lines([truncated])


AZURE = ("TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
         "2023-11-16 18:15:46.6805900,4808,10\r\n"
         "2023-11-16 18:15:50.9951690,3180,8\r\n"
         "2023-11-16 18:15:51.1567700,110,27\r\n")
BURSTGPT = ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
            "5,ChatGPT,472,18,490,Conversation log\n"
            "45,ChatGPT,1087,0,1087,Conversation log\n"
            "118,GPT-4,417,276,693,API log\n")


def test_the_azure_and_burstgpt_csvs_read_as_requests_without_prefix_ids(tmp_path: Path) -> None:
    azure = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    azure.write_text(AZURE)
    lines = read_lines([azure])
    assert [(line.input_length, line.output_length, line.hash_ids) for line in lines] == [
        (4808, 10, ()), (3180, 8, ()), (110, 27, ())]
    assert lines[1].timestamp_ms - lines[0].timestamp_ms == 4314  # the fraction kept
    burst = tmp_path / "BurstGPT_1.csv"
    burst.write_text(BURSTGPT)
    lines = read_lines([burst])
    assert [(line.timestamp_ms, line.model, line.input_length, line.output_length)
            for line in lines] == [(5000, "ChatGPT", 472, 18), (45000, "ChatGPT", 1087, 0),
                                   (118000, "GPT-4", 417, 276)]
    workload = build_workload(lines, model="ChatGPT")
    assert len(workload) == 2 and workload.items[1].arrival == 40.0
    assert "no hash ids" in trace_notes(workload)[0]
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,10,1\n")
    with pytest.raises(TraceFormatError, match="bad.csv: trace line 2: TIMESTAMP 'yesterday'"):
        read_lines([bad])


def test_the_command_replays_a_csv_and_says_what_it_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    azure = tmp_path / "azure.csv"
    azure.write_text(AZURE + "2023-11-16 18:15:52.0000000,90000,10\n")  # over the KV cache
    assert replay_cli.main([str(azure), "--replicas", "1", "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "note: the trace has no hash ids" in text
    assert "refused: 1 of 4 requests at every count" in text
    assert replay_cli.main([str(azure), "--replicas", "1", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["notes"] and document["replays"][0]["rejected"] == 1


def test_ids_of_fewer_tokens_than_mooncakes_512_are_refused_not_mostly_dropped(
        tmp_path: Path) -> None:
    """62 ids for 1,000 tokens is a trace of 16-token ids without its block size: read as
    512 tokens an id, its prompts used 2 ids each and lost the prefixes the others share."""
    line = {"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": list(range(62))}
    path = tmp_path / "ids16.jsonl"
    path.write_text(_text([line]))
    with pytest.raises(TraceFormatError, match="62 hash ids for 1000 tokens.*block_size"):
        read_lines([path])
    path.write_text(_text([{**line, "block_size": 16}]))  # said: read as it says
    (read,) = read_lines([path])
    assert read.block_size == 16 and len(read.hash_ids) == 62


def test_prompts_over_the_planned_max_model_len_are_counted_in_a_note() -> None:
    """The replay serves them (vLLM would refuse them): the report said nothing of it."""
    from gateway.trace.format import TraceLine
    workload = build_workload([TraceLine(i * 1000, length, 5, (1,))
                               for i, length in enumerate((100, 40_000, 33_000, 2_000))])
    assert trace_notes(workload) == ()
    (note,) = trace_notes(workload, max_model_len=32_768)
    assert note.startswith("2 of 4 prompts are longer than the planned max_model_len (32,768")


def test_timestamps_in_microseconds_or_nanoseconds_are_refused(tmp_path: Path) -> None:
    """Read as milliseconds, 17 minutes of traffic in microseconds would take 12 days."""
    path = tmp_path / "us.jsonl"
    path.write_text(_text([{**r, "timestamp": 1_796_282_980_522_000 + 1000 * r["timestamp"]}  # type: ignore[operator]
                           for r in MOONCAKE]))
    with pytest.raises(TraceFormatError, match="us.jsonl: trace line 1: .*microseconds or "
                                               "nanoseconds"):
        read_lines([path])


def test_burstgpts_failed_rows_are_left_out_and_its_later_columns_read(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """BurstGPT_1.csv holds failed requests as "0,0,0" (its 22nd line is one), and its
    later releases add "Session ID" and "Elapsed time" columns: the file was refused."""
    burst = tmp_path / "BurstGPT_v2.csv"
    burst.write_text("Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,"
                     "Total tokens,Log Type\n"
                     "5,,1.2,ChatGPT,472,18,490,Conversation log\n"
                     "1106,,0.3,ChatGPT,0,0,0,Conversation log\n"
                     "1129,7,2.0,GPT-4,1305,477,1782,Conversation log\n")
    with caplog.at_level("WARNING", logger="prefixgate.trace"):
        lines = read_lines([burst])
    assert [(line.model, line.input_length, line.output_length) for line in lines] == [
        ("ChatGPT", 472, 18), ("GPT-4", 1305, 477)]
    assert "1 row(s) with no tokens at all left out" in caplog.text
    assert str(burst) in caplog.text
