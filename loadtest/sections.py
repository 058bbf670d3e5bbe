"""Where a gateway's CPU goes, section by section (``python -m loadtest overhead
--cpu-sections``).

Each prefixgate gateway starts with ``loadtest/cpu_sections`` first on its
``PYTHONPATH`` (see that folder's ``sitecustomize``): named functions of the request
path, the KV-event follower, the linter and the workers' sharing add their thread's
CPU time to a section. Before and after each measured round the benchmark signals
every process of the gateway's tree that wrote a file, reads the totals, and keeps the
difference; a section's figure is its CPU over the measured rounds divided by the
requests sent, in microseconds, and the rest of the process's CPU (the server, the
relay, the event loop, metrics, what no section names) is reported beside it.

The wrapping costs about 2 us a wrapped call (two ``thread_time`` system calls), some
40 us a request, in the figures; compare sections between paths of one run, not with a
run without the flag.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from loadtest.proc_tree import all_stats, descendants

HARNESS = Path(__file__).resolve().parent / "cpu_sections"
ENV = "PREFIXGATE_CPU_SECTIONS"
WAIT_SECONDS = 3.0


@dataclass
class Reading:
    """One process's totals: per section ``[ns, calls]``, and its own CPU."""

    seq: int
    process_ns: int
    sections: dict[str, list[int]]
    missing: list[str] = field(default_factory=list)


@dataclass
class Tally:
    """A path's sections over the measured rounds."""

    sections: dict[str, list[int]] = field(default_factory=dict)
    process_ns: int = 0
    requests: int = 0
    missing: set[str] = field(default_factory=set)

    def add(self, before: Mapping[int, Reading], after: Mapping[int, Reading],
            requests: int) -> None:
        self.requests += requests
        for pid, now in after.items():
            then = before.get(pid)  # a process started during the round counts from zero
            self.process_ns += now.process_ns - (then.process_ns if then else 0)
            self.missing.update(now.missing)
            for section, (ns, calls) in now.sections.items():
                was = then.sections.get(section, [0, 0]) if then else [0, 0]
                entry = self.sections.setdefault(section, [0, 0])
                entry[0] += ns - was[0]
                entry[1] += calls - was[1]


@contextmanager
def harness(folder: Path) -> Iterator[None]:
    """Processes started inside get the harness (it acts only in a gateway), writing to
    ``folder`` wherever they run (a gateway from another checkout runs there)."""
    folder = folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    saved = {key: os.environ.get(key) for key in ("PYTHONPATH", ENV)}
    paths = [str(HARNESS)] + ([saved["PYTHONPATH"]] if saved["PYTHONPATH"] else [])
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    os.environ[ENV] = str(folder)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _read(path: Path) -> Reading | None:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return Reading(raw["seq"], raw["process_ns"], raw["sections"], raw.get("missing", []))


def read_tree(folder: Path, root: int, wait: float = WAIT_SECONDS) -> dict[int, Reading]:
    """Every process of ``root``'s tree that carries the harness, read now (signalled,
    then its file waited for until ``wait`` seconds)."""
    pids = [pid for pid in descendants(root, all_stats()) if (folder / f"{pid}.json").exists()]
    asked: dict[int, int] = {}
    for pid in pids:
        old = _read(folder / f"{pid}.json")
        try:
            os.kill(pid, signal.SIGUSR2)
        except ProcessLookupError:
            continue
        asked[pid] = old.seq if old else 0
    readings: dict[int, Reading] = {}
    deadline = time.monotonic() + wait
    while asked and time.monotonic() < deadline:
        for pid, seq in list(asked.items()):
            reading = _read(folder / f"{pid}.json")
            if reading is not None and reading.seq > seq:
                readings[pid] = reading
                del asked[pid]
        if asked:
            time.sleep(0.01)
    return readings


def table(tallies: Mapping[str, Tally]) -> str:
    """Microseconds of CPU a request, by section (rows) and path (columns)."""
    names = [name for name, tally in tallies.items() if tally.requests]
    if not names:
        return ""
    order: list[str] = []
    for name in names:
        for section, (ns, _) in sorted(tallies[name].sections.items(), key=lambda kv: -kv[1][0]):
            if section not in order:
                order.append(section)
    head = ["section (us of CPU a request; calls a request)", *names]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cell(tally: Tally, ns: int, calls: int | None = None) -> str:
        us = ns / 1e3 / tally.requests
        return f"{us:.0f}" + (f" ({calls / tally.requests:.1f})" if calls is not None else "")

    for section in order:
        row = [section]
        for name in names:
            ns, calls = tallies[name].sections.get(section, [0, 0])
            row.append(cell(tallies[name], ns, calls) if calls else "-")
        lines.append("| " + " | ".join(row) + " |")
    named = {n: sum(ns for ns, _ in tallies[n].sections.values()) for n in names}
    lines.append("| sections, in all | " + " | ".join(
        cell(tallies[n], named[n]) for n in names) + " |")
    lines.append("| the rest (server, relay, event loop, metrics, ...) | " + " | ".join(
        cell(tallies[n], tallies[n].process_ns - named[n]) for n in names) + " |")
    lines.append("| the gateway's processes, in all | " + " | ".join(
        cell(tallies[n], tallies[n].process_ns) for n in names) + " |")
    missing = sorted(set().union(*(tallies[n].missing for n in names)))
    note = ("\nNot found in a gateway (not wrapped): " + ", ".join(missing) + "\n"
            if missing else "")
    return "\n".join(lines) + "\n" + note


def as_json(tallies: Mapping[str, Tally]) -> dict[str, object]:
    return {name: {"requests": t.requests, "process_ns": t.process_ns,
                   "sections": t.sections, "missing": sorted(t.missing)}
            for name, t in tallies.items()}

