"""``prefixgate lint FILE...`` as a CI gate: exit status, formats, places, pipes, hooks."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gateway.cli import main

SYSTEM = "You are a release-notes writer. Be precise and short. " * 3 + "Today is 2026-11-30."
STAMPED = {"messages": [{"role": "system", "content": SYSTEM},
                        {"role": "user", "content": "Summarize the changes."}]}
DATE_AT = f"messages[0].content:{SYSTEM.index('2026')}-{SYSTEM.index('2026') + 10}"
CLEAN = {"messages": [
    {"role": "system", "content": "You are a release-notes writer. Be precise and short. " * 3},
    {"role": "user", "content": "Summarize the changes of 2026-11-30."}]}
NOW = ["--now", "2026-11-30T15:30:00+00:00"]
ROOT = str(Path(__file__).resolve().parents[3])


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


# -- many files, places, SARIF, pipes, pre-commit -------------------------------------------

NAMED = {"messages": [
    {"role": "system", "content": "Help the customer Maria Lopez with her order. Always be "
                                  "polite, and keep answers short and precise."},
    {"role": "user", "content": "Where is it?"}]}
NAMED_YAML = """\
messages:
  - role: system
    content: |
      You are the assistant of Acme Travel, precise and kind to every traveller.
      Help the customer Maria Lopez with her order today.
  - role: user
    content: "Where is it?"
"""


def write(tmp_path: Path, name: str, content: str) -> str:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content, encoding="utf-8")
    return str(path)


def test_many_files_each_placed_at_line_and_column(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pretty = write(tmp_path, "named.json", json.dumps(NAMED, indent=2))
    clean = write(tmp_path, "clean.json", json.dumps(CLEAN))
    log = write(tmp_path, "log.jsonl", "\n".join(
        json.dumps({"ts": i, "body": STAMPED}) for i in range(2)))
    yml = write(tmp_path, "named.yaml", NAMED_YAML)
    code = main(["lint", pretty, clean, log, yml, *NOW])
    out = capsys.readouterr().out
    assert code == 1
    lines = Path(pretty).read_text().splitlines()
    [(row, text)] = [(i, t) for i, t in enumerate(lines, 1) if "Maria" in t]
    assert f"{pretty}:{row}:{text.index('Maria') + 1}: warning  name" in out
    stamp = json.dumps({"ts": 0, "body": STAMPED}).index("2026-11-30")
    assert f"{log}:1:{stamp + 1}: " in out and f"{log}:2:{stamp + 1}: " in out
    yaml_line = NAMED_YAML.splitlines()[4]
    assert f"{yml}:5:{yaml_line.index('Maria') + 1}: warning  name" in out
    assert f"{clean}: 0 warning(s)" in out


def test_json_for_many_files_gives_each_finding_its_location(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pretty = write(tmp_path, "named.json", json.dumps(NAMED, indent=2))
    yml = write(tmp_path, "named.yaml", NAMED_YAML)
    assert main(["lint", pretty, yml, "--format", "json", *NOW]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["object"] == "prompt.lint.files"
    assert [f["file"] for f in out["files"]] == [pretty, yml]
    [named] = [f for f in out["files"][1]["findings"] if f["kind"] == "name"]
    assert named["location"]["line"] == 5 and named["location"]["file"] == yml
    line = NAMED_YAML.splitlines()[4]
    assert line[named["location"]["column"] - 1:named["location"]["end_column"] - 1] == (
        "Maria Lopez")


def test_an_unreadable_file_is_status_2_and_the_others_are_still_linted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write(tmp_path, "named.json", json.dumps(NAMED))
    bad = write(tmp_path, "package.json", json.dumps({"name": "web", "version": "1.0.0"}))
    assert main(["lint", bad, good, *NOW]) == 2
    captured = capsys.readouterr()
    assert f"{bad}: no chat request found" in captured.err
    assert f"{good}: 1 warning(s)" in captured.out


def test_sarif_output_for_code_scanning(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    pretty = write(tmp_path, "named.json", json.dumps(NAMED, indent=2))
    stamped = write(tmp_path, "stamped.json", json.dumps(STAMPED))
    code = main(["lint", pretty, stamped, "--format", "sarif", *NOW])
    log = json.loads(capsys.readouterr().out)
    assert code == 1 and log["version"] == "2.1.0"
    [run] = log["runs"]
    rules = [rule["id"] for rule in run["tool"]["driver"]["rules"]]
    results = {(r["ruleId"], r["level"]): r for r in run["results"]}
    assert {"name", "date"} <= set(rules)
    name = results[("name", "warning")]
    region = name["locations"][0]["physicalLocation"]["region"]
    lines = Path(pretty).read_text().splitlines()
    assert lines[region["startLine"] - 1][region["startColumn"] - 1:
                                          region["endColumn"] - 1] == "Maria Lopez"
    assert "Maria" not in name["message"]["text"]  # the region points at it; no prompt text
    assert rules[name["ruleIndex"]] == "name"
    assert name["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].startswith(
        "file://")


def test_model_is_the_tokenizers_name_or_null(tmp_path: Path, qwen_dir: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    prompt = write(tmp_path, "clean.json", json.dumps(CLEAN))
    main(["lint", prompt, "--json", *NOW])
    assert json.loads(capsys.readouterr().out)["model"] == "Qwen3 (bundled)"
    copy = tmp_path / "tok"
    copy.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (copy / name).write_bytes((Path(qwen_dir) / name).read_bytes())
    main(["lint", prompt, "--json", "--tokenizer", str(copy), *NOW])
    assert json.loads(capsys.readouterr().out)["model"] is None
    main(["lint", prompt, "--json", "--model", "Qwen/Qwen3-8B", *NOW])
    assert json.loads(capsys.readouterr().out)["model"] == "Qwen/Qwen3-8B"


def test_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """``prefixgate lint ... | head -1``: more output than a pipe holds, the reader gone."""
    prompt = write(tmp_path, "named.json", json.dumps(NAMED))
    command = [sys.executable, "-m", "gateway.cli", "lint", *[prompt] * 120, *NOW]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          cwd=ROOT) as process:
        assert process.stdout is not None and process.stderr is not None
        first = process.stdout.readline()
        process.stdout.close()
        errors = process.stderr.read().decode()
        code = process.wait(timeout=300)
    assert first.startswith(prompt.encode())
    assert "Traceback" not in errors and "BrokenPipe" not in errors, errors
    assert code == 1


def test_the_pre_commit_hook(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hooks = yaml.safe_load((Path(ROOT) / ".pre-commit-hooks.yaml").read_text())
    hook = next(h for h in hooks if h["id"] == "prefixgate-lint")
    assert hook["language"] == "python" and hook["entry"] == "prefixgate lint"
    pattern = re.compile(hook["files"])
    assert pattern.search("prompts/support.json") and pattern.search("app/prompt/a.yaml")
    assert not pattern.search("package.json") and not pattern.search("prompts.py")
    # pre-commit runs the entry with the matching files appended.
    files = [write(tmp_path, "prompts/clean.json", json.dumps(CLEAN)),
             write(tmp_path, "prompts/named.yaml", NAMED_YAML)]
    assert main(hook["entry"].split()[1:] + files + NOW) == 1
    assert "named.yaml:5:" in capsys.readouterr().out


# -- folders, bad arguments, broken files in SARIF -------------------------------------------


def test_a_folder_is_its_prompt_files_and_other_json_is_skipped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path, "prompts/named.json", json.dumps(NAMED))
    write(tmp_path, "prompts/deep/stamped.yaml", yaml.safe_dump(STAMPED))
    write(tmp_path, "prompts/package.json", json.dumps({"name": "web"}))
    write(tmp_path, "prompts/notes.txt", "Today is 2026-11-30.")
    write(tmp_path, "prompts/.hidden/x.json", json.dumps(STAMPED))
    assert main(["lint", str(tmp_path / "prompts"), *NOW]) == 1  # warnings, nothing broken
    captured = capsys.readouterr()
    assert "named.json: 1 warning(s)" in captured.out
    assert "deep/stamped.yaml: 1 warning(s)" in captured.out
    assert "Is a directory" not in captured.err and ".hidden" not in captured.out
    assert "package.json: skipped: no chat request in it" in captured.err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["lint", str(empty)]) == 2
    assert "no prompt files" in capsys.readouterr().err


def test_block_size_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as refused:
        main(["lint", write(tmp_path, "p.json", json.dumps(CLEAN)), "--block-size", "0"])
    assert refused.value.code == 2


def test_truncated_json_is_reported_where_it_breaks(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = json.dumps(STAMPED, indent=2)
    cut = text[: text.index('"user"')]
    assert main(["lint", write(tmp_path, "prompt.json", cut)]) == 2
    line = cut.count("\n") + 1  # where the text stops, not line 1
    assert line > 1 and f"prompt.json: line {line} column" in capsys.readouterr().err
    log = "\n".join([json.dumps(CLEAN), json.dumps(CLEAN), '{"messages": [', json.dumps(CLEAN)])
    assert main(["lint", write(tmp_path, "log.jsonl", log)]) == 2
    assert "log.jsonl: line 3 column" in capsys.readouterr().err


def test_sarif_quotes_no_prompt_text_unless_asked_and_lists_what_it_could_not_lint(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stamped = write(tmp_path, "stamped.json", json.dumps(STAMPED))
    broken = write(tmp_path, "broken.json", json.dumps(CLEAN)[:-3])
    assert main(["lint", stamped, broken, "--format", "sarif", *NOW]) == 2
    [run_] = json.loads(capsys.readouterr().out)["runs"]
    messages = " ".join(result["message"]["text"] for result in run_["results"])
    assert run_["results"] and "2026" not in messages  # no normalized timestamp either
    [invocation] = run_["invocations"]
    assert invocation["executionSuccessful"] is False
    [note] = invocation["toolExecutionNotifications"]
    assert note["level"] == "error" and "not JSON" in note["message"]["text"]
    place = note["locations"][0]["physicalLocation"]
    assert place["artifactLocation"]["uri"].endswith("broken.json")
    assert place["region"]["startLine"] == 1
    assert main(["lint", stamped, "--format", "sarif", "--sarif-prompt-text", *NOW]) == 1
    [run_] = json.loads(capsys.readouterr().out)["runs"]
    assert "2026-11-30" in " ".join(r["message"]["text"] for r in run_["results"])
    assert run_["invocations"] == [{"executionSuccessful": True,
                                    "toolExecutionNotifications": []}]


def _two_systems(first: str, second: str) -> str:
    policy = (" You are the support assistant of Northwind Outfitters. Be concise and friendly. "
              "Never promise refunds outside the 30-day return policy.")
    return json.dumps({"requests": [
        {"model": "m", "messages": [{"role": "system", "content": text + policy},
                                    {"role": "user", "content": "Hi"}]}
        for text in (first, second)]}, indent=1)


def test_a_value_extending_another_is_a_warning(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(tmp_path, capsys, _two_systems("Tier: gold.", "Tier: golden."))
    assert code == 1
    assert "varies   text       messages[0].content:6-10  token 5  2 values: 'gold', 'golden'" in out
    assert "request 0: 47 prompt tokens; cacheable prefix 0 tokens" in out
    assert "nothing breaks prefix caching" not in out


def test_an_invisible_difference_is_placed_at_the_request_that_has_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    content = _two_systems("Rules:\nBe brief.", "Rules:\r\nBe brief.")
    code, out = run(tmp_path, capsys, content, "--json")
    assert code == 1
    report = json.loads(out)
    (finding,) = report["groups"][0]["findings"]
    assert finding["kind"] == "unicode" and finding["request"] == 1
    assert (finding["start"], finding["end"], finding["text"]) == (6, 8, "\r\n")
    assert "'\\r\\n' (CR, LF)" in finding["detail"] and "'\\n' (LF)" in finding["detail"]
    line = content.splitlines().index(next(x for x in content.splitlines() if "\\r\\n" in x))
    assert finding["location"]["line"] == line + 1
    assert finding["token_start"] is not None
    (own,) = [f for f in report["requests"][1]["findings"] if f["severity"] == "warning"]
    assert (own["kind"], own["start"], own["end"]) == ("unicode", 6, 8)
    assert report["requests"][0]["warnings"] == 0
    code, out = run(tmp_path, capsys, content)
    assert "warning  unicode          messages[0].content:6-8  token 4  '\\r\\n'" in out


def test_a_long_varying_passage_is_shown_cut_short(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota",
             "kappa", "lambda", "mu"]
    lines = [json.dumps({"messages": [
        {"role": "system", "content": "Answer from the context.\nContext: "
         + " ".join(words[(i + j * 5) % len(words)] for j in range(400)) + "\nBe brief."},
        {"role": "user", "content": "hello"}]}) for i in range(3)]
    code, out = run(tmp_path, capsys, "\n".join(lines), name="rag.jsonl")
    assert code == 1
    (varies,) = [line for line in out.splitlines() if line.lstrip().startswith("varies")]
    assert "document" in varies and varies.count("…") == 3 and len(varies) < 400
    assert max(len(line) for line in out.splitlines()) < 400  # no passage printed whole


def test_a_file_with_a_byte_order_mark_is_linted_and_placed_as_without(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Windows editors save UTF-8 with a byte order mark: it was "not JSON", status 2."""
    plain = run(tmp_path, capsys, json.dumps(STAMPED))
    marked = run(tmp_path, capsys, "\ufeff" + json.dumps(STAMPED), name="bom.json")
    assert marked[0] == plain[0] == 1
    assert marked[1].replace("bom.json", "prompt.json") == plain[1]


@pytest.mark.parametrize("codec", ["utf-16", "utf-32"])
def test_a_utf16_or_utf32_file_with_its_byte_order_mark_is_linted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], codec: str) -> None:
    plain = run(tmp_path, capsys, json.dumps(STAMPED))
    path = tmp_path / "wide.json"
    path.write_bytes(json.dumps(STAMPED).encode(codec))  # the codec writes its mark first
    assert main(["lint", str(path), *NOW]) == plain[0] == 1
    assert capsys.readouterr().out.replace("wide.json", "prompt.json") == plain[1]


def test_a_file_that_is_not_utf8_is_status_2_with_a_reason(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "latin1.json"
    path.write_bytes(json.dumps({"messages": [{"role": "user", "content": "é"}]},
                                ensure_ascii=False).encode("latin-1"))
    assert main(["lint", str(path)]) == 2
    assert "not UTF-8 text" in capsys.readouterr().err


def test_a_lone_surrogate_escape_is_status_2_in_words(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``"\\ud800"`` is valid JSON no tokenizer takes: the message was the tokenizer's own
    ('TextEncodeInput must be Union[...]')."""
    broken = write(tmp_path, "broken.json", json.dumps(
        {"messages": [{"role": "system", "content": "Be brief.\ud800"}]}))
    clean = write(tmp_path, "clean.json", json.dumps(CLEAN))
    assert main(["lint", broken, clean]) == 2
    err = capsys.readouterr().err
    assert f"{broken}: the prompt holds a lone UTF-16 surrogate" in err
    assert "TextEncodeInput" not in err
