"""``prefixgate lint FILE`` as a CI gate: exit status, formats, output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.cli import main

SYSTEM = "You are a release-notes writer. Be precise and short. " * 3 + "Today is 2026-11-30."
STAMPED = {"messages": [{"role": "system", "content": SYSTEM},
                        {"role": "user", "content": "Summarize the changes."}]}
DATE_AT = f"messages[0].content:{SYSTEM.index('2026')}-{SYSTEM.index('2026') + 10}"
CLEAN = {"messages": [
    {"role": "system", "content": "You are a release-notes writer. Be precise and short. " * 3},
    {"role": "user", "content": "Summarize the changes of 2026-11-30."}]}
NOW = ["--now", "2026-11-30T15:30:00+00:00"]


def run(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, *args: str,
        name: str = "prompt.json") -> tuple[int, str]:
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    code = main(["lint", str(path), *NOW, *args])
    return code, capsys.readouterr().out


def test_warning_fails_and_clean_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(tmp_path, capsys, json.dumps(STAMPED))
    assert code == 1
    assert "warning  date" in out and DATE_AT in out and "1 warning(s)" in out
    code, out = run(tmp_path, capsys, json.dumps(CLEAN))
    assert code == 0
    assert "info     date" in out and "0 warning(s): nothing breaks prefix caching" in out


def test_json_output_and_block_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(tmp_path, capsys, json.dumps(STAMPED), "--json", "--block-size", "32")
    report = json.loads(out)
    assert code == 1 and report["block_size"] == 32
    assert report["cacheable_prefix_tokens"] % 32 == 0
    assert report["findings"][0]["text"] == "2026-11-30"


def test_jsonl_log_is_compared_across_requests(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    lines = [json.dumps({"ts": i, "body": {"messages": [
        {"role": "system", "content": f"Assist the user {name}. Keep answers short and kind."},
        {"role": "user", "content": "hello"}]}}) for i, name in enumerate(["Ada", "Bo", "Cy"])]
    code, out = run(tmp_path, capsys, "\n".join(lines), "--json", name="log.jsonl")
    report = json.loads(out)
    assert code == 1 and report["object"] == "prompt.lint.batch"
    assert [v["examples"] for v in report["groups"][0]["varying"]] == [["Ada", "Bo", "Cy"]]


def test_unreadable_input_is_status_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(tmp_path, capsys, "not json\n{also not}")[0] == 2
    assert main(["lint", str(tmp_path / "missing.json")]) == 2
    assert "prefixgate lint:" in capsys.readouterr().err
