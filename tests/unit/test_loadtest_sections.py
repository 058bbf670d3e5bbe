"""``python -m loadtest overhead --cpu-sections``: a gateway's CPU by section of its work."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from loadtest import sections
from loadtest.cpu_sections.sitecustomize import SECTIONS

REPO = Path(__file__).resolve().parents[2]


def readings_of(script: str, cwd: Path, folder: Path, written: Path) -> sections.Reading:
    """What a child started under the harness (``folder``, as given) wrote to ``written``
    once it printed ``ready``."""
    with sections.harness(folder):
        child = subprocess.Popen([sys.executable, "-c", script], cwd=cwd,
                                 stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        return sections.read_tree(written, child.pid)[child.pid]
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize(("section", "module", "name"), SECTIONS)
def test_every_section_names_a_synchronous_function_of_the_gateway(
        section: str, module: str, name: str) -> None:
    # a renamed function would drop out of the breakdown unseen (listed as missing)
    owner: object = importlib.import_module(module)
    *path, attr = name.split(".")
    for part in path:
        owner = getattr(owner, part)
    fn = vars(owner)[attr] if path else getattr(owner, attr)
    assert callable(fn) and not inspect.iscoroutinefunction(fn)


def test_a_process_with_the_harness_counts_each_sections_calls_and_cpu(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = textwrap.dedent("""
        import sys, time
        from gateway.fleet.codec import Load, decode_batch, encode_batch
        payload = encode_batch("w1", [Load({"r": 1})])
        for _ in range(250):
            decode_batch(payload)
        print("ready", flush=True)
        time.sleep(30)
    """)
    monkeypatch.chdir(tmp_path)  # a relative folder, and a child running elsewhere
    reading = readings_of(script, REPO, Path("sections"), tmp_path / "sections")
    ns, calls = reading.sections["siblings' batches: decode"]
    assert calls == 250 and 0 < ns <= reading.process_ns
    assert reading.missing == []


def test_a_process_without_the_harness_is_never_signalled(tmp_path: Path) -> None:
    # SIGUSR2 would end a process that has no handler for it: only one that wrote is asked
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert sections.read_tree(tmp_path, child.pid, wait=0.2) == {}
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()


def test_a_tally_keeps_what_each_round_added_per_request() -> None:
    tally = sections.Tally()
    before = {1: sections.Reading(1, 1_000_000, {"parse": [500_000, 10]})}
    after = {1: sections.Reading(2, 5_000_000, {"parse": [900_000, 30], "decide": [100_000, 20]}),
             2: sections.Reading(1, 2_000_000, {"decide": [300_000, 20]})}  # started meanwhile
    tally.add(before, after, requests=20)
    assert tally.sections == {"parse": [400_000, 20], "decide": [400_000, 40]}
    assert tally.process_ns == 6_000_000
    table = sections.table({"prefixgate:default": tally})
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1].rstrip(" |")
            for line in table.splitlines()[2:] if line.startswith("| ")}
    assert rows["parse"] == "20 (1.0)" and rows["decide"] == "20 (2.0)"
    assert rows["the rest (server, relay, event loop, metrics, ...)"] == "260"
    assert rows["the gateway's processes, in all"] == "300"


def test_a_section_the_checkout_does_not_have_is_listed_not_fatal(tmp_path: Path) -> None:
    # an older checkout without a named class still starts, the section listed as missing
    script = textwrap.dedent("""
        import sys, time
        import gateway.fleet.shared
        print("ready", flush=True)
        time.sleep(30)
    """)
    tree = tmp_path / "tree"
    (tree / "gateway" / "fleet").mkdir(parents=True)
    (tree / "gateway" / "__init__.py").write_text("")
    (tree / "gateway" / "fleet" / "__init__.py").write_text("")
    (tree / "gateway" / "fleet" / "shared.py").write_text("VERSION = 0\n")  # no class
    reading = readings_of(script, tree, tmp_path / "sections", tmp_path / "sections")
    assert reading.missing == ["gateway.fleet.shared.SharedRouting._apply_batch"]
