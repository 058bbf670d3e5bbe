"""``prefixgate lint`` on an Anthropic Messages API body: linted as the chat request vLLM
renders it, every finding placed on the body's own paths, lines and columns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.cli import main

NOW = ["--now", "2026-11-30T15:30:00+00:00"]
BRIEF = "You are the travel assistant of Acme. Be brief, precise and friendly. " * 2


def lint(tmp_path: Path, capsys: pytest.CaptureFixture[str], body: object,
         name: str = "prompt.json") -> tuple[int, dict, str]:
    text = body if isinstance(body, str) else json.dumps(body, indent=1)
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    code = main(["lint", str(path), *NOW, "--json"])
    return code, json.loads(capsys.readouterr().out), text


def at(text: str, value: str) -> tuple[int, int]:
    """Line and column (1-based) where ``value`` first is in ``text``."""
    before = text[:text.index(value)]
    return before.count("\n") + 1, len(before) - before.rfind("\n")


def test_the_system_string_is_the_system_prompt(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    system = BRIEF + "Today is Monday, 30 November 2026."
    body = {"model": "claude", "max_tokens": 64, "system": system,
            "messages": [{"role": "user", "content": "Any flights to Oslo?"}]}
    code, report, text = lint(tmp_path, capsys, body)
    assert code == 1
    [finding] = report["findings"]
    assert (finding["kind"], finding["severity"], finding["path"]) == ("date", "warning", "system")
    assert system[finding["start"]:finding["end"]] == "Monday, 30 November 2026"
    location = finding["location"]
    assert (location["line"], location["column"]) == at(text, "Monday, 30")


def test_system_blocks_tools_and_tool_results_keep_their_own_paths(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body = {"model": "claude", "max_tokens": 64,
            "system": [{"type": "text", "text": "x-anthropic-billing-header: cch=1f2e;"},
                       {"type": "text", "text": BRIEF},
                       {"type": "text", "text": "Session opened 2026-11-30T15:20:00Z."}],
            "tools": [{"name": "search", "input_schema": {"type": "object"},
                       "description": "Search flights. Index built 2026-11-30T15:00:00Z."}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Find Oslo flights."}]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "tu_1", "name": "search", "input": {"to": "OSL"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "tu_1", "content": [
                        {"type": "text", "text": "2 flights"},
                        {"type": "text", "text": "fetched 2026-11-30T15:21:07Z"}]},
                    {"type": "text", "text": "Book the first."}]},
                {"role": "assistant", "content": "Booked."},
                {"role": "user", "content": "Thanks!"}]}
    code, report, text = lint(tmp_path, capsys, body)
    assert code == 1
    placed = [(f["path"], f["text"], (f["location"]["line"], f["location"]["column"]))
              for f in report["findings"] if f["severity"] == "warning"]
    assert placed == [
        ("system[2].text", "2026-11-30T15:20:00Z", at(text, "2026-11-30T15:20")),
        ("tools[0].description", "2026-11-30T15:00:00Z", at(text, "2026-11-30T15:00")),
        ("messages[2].content[0].content[1].text", "2026-11-30T15:21:07Z",
         at(text, "2026-11-30T15:21"))]
    assert [f["start"] for f in report["findings"] if f["severity"] == "warning"] == [
        len("Session opened "), len("Search flights. Index built "), len("fetched ")]


def test_a_log_of_messages_bodies_finds_what_varies_in_the_system_prompt(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = "\n".join(json.dumps({"body": {
        "model": "claude", "system": BRIEF + f"Assist {name} with bookings.",
        "messages": [{"role": "user", "content": "hello"}]}}) for name in ("Ada", "Bo", "Cy"))
    code, report, _ = lint(tmp_path, capsys, lines, name="log.jsonl")
    assert code == 1
    [span] = report["groups"][0]["varying"]
    assert (span["path"], span["examples"]) == ("system", ["Ada", "Bo", "Cy"])


def test_a_chat_request_is_read_as_before(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    body = {"messages": [{"role": "system", "content": BRIEF + "Today is 2026-11-30."},
                         {"role": "user", "content": "hi"}]}
    code, report, _ = lint(tmp_path, capsys, body)
    assert code == 1 and report["findings"][0]["path"] == "messages[0].content"


# -- media parts -----------------------------------------------------------------------------

MEDIA = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
         {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
         {"type": "file", "file": {"file_id": "file-abc"}},
         {"type": "video_url", "video_url": {"url": "https://example.com/a.mp4"}}]


def test_media_parts_are_noted_and_the_text_beside_them_is_linted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body = {"messages": [
        {"role": "system", "content": BRIEF},
        {"role": "user", "content": [{"type": "text", "text": "Sent 2026-11-30T15:20:00Z."},
                                     *MEDIA]},
        {"role": "assistant", "content": "A cat."},
        {"role": "user", "content": [MEDIA[0], {"type": "text", "text": "And this one?"}]}]}
    code, report, _ = lint(tmp_path, capsys, body)
    assert code == 1  # linted (a warning), not a file that could not be linted (2)
    found = [(f["kind"], f["severity"], f["path"], f["text"]) for f in report["findings"]]
    assert ("timestamp", "warning", "messages[1].content[0].text",
            "2026-11-30T15:20:00Z") in found
    assert [item for item in found if item[0] == "media"] == [
        ("media", "info", f"messages[1].content[{k}]", part["type"])
        for k, part in enumerate(MEDIA, start=1)] + [
        ("media", "info", "messages[3].content[0]", "image_url")]


def test_an_image_block_of_a_messages_api_body_is_noted_at_its_place(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "iVBORw0KGgo="}}
    body = {"model": "claude", "max_tokens": 64, "system": BRIEF,
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "What is this?"}, image]}]}
    code, report, _ = lint(tmp_path, capsys, body)
    assert code == 0
    assert [(f["kind"], f["path"]) for f in report["findings"]] == [
        ("media", "messages[0].content[1]")]
