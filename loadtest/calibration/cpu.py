"""Who else used the engine's core while a probe ran (Linux ``/proc``).

The calibration runs on a machine shared with other work. The engine is
pinned to one core, so the clearest sign of interference is time that core
spent running *other* processes during a sample. A :class:`CoreMeter` reads
two counters, in clock ticks (``USER_HZ``, usually 100 per second):

* the core's busy and total time from its ``cpuN`` line of ``/proc/stat``;
* the CPU time (user + system) of every process in the target's process
  group (vLLM's API server and engine core, or the simulator), summed over
  ``/proc/<pid>/stat`` entries whose ``pgrp`` matches.

The difference of two readings gives :class:`CoreShare`: the fraction of the
interval the core ran the target, and the fraction it ran anything else
(``foreign``). Both counters move in ticks and a running process's own
counter lags until it is descheduled, so a window of 0.1 s can misjudge the
split by half; over a second or more it is within a few percent (checked
against a pinned busy loop). The probes therefore read the meter around a
whole decode trial or a whole round of prefill requests, never around one
short request. Without ``/proc`` (or for a target whose processes are not
ours) there is no meter and samples carry ``None``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class CoreReading:
    core_busy: int
    core_total: int
    group_cpu: int


@dataclass(frozen=True, slots=True)
class CoreShare:
    target: float
    """Fraction of the interval the core ran the target's processes."""
    foreign: float
    """Fraction of the interval the core ran anything else."""


class CoreMeter:
    def __init__(self, core: int, process_group: int, proc: Path = Path("/proc")) -> None:
        self._core = core
        self._group = process_group
        self._proc = proc

    @classmethod
    def available(cls, core: int, process_group: int | None) -> CoreMeter | None:
        if process_group is None or not Path("/proc/stat").is_file():
            return None
        return cls(core, process_group)

    def read(self) -> CoreReading:
        busy, total = self._core_ticks()
        return CoreReading(busy, total, self._group_ticks())

    @staticmethod
    def share(before: CoreReading, after: CoreReading) -> CoreShare | None:
        total = after.core_total - before.core_total
        if total <= 0:
            return None
        group = max(after.group_cpu - before.group_cpu, 0)
        busy = max(after.core_busy - before.core_busy, 0)
        return CoreShare(target=min(group / total, 1.0),
                         foreign=min(max(busy - group, 0) / total, 1.0))

    def _core_ticks(self) -> tuple[int, int]:
        name = f"cpu{self._core}"
        for line in (self._proc / "stat").read_text().splitlines():
            fields = line.split()
            if fields and fields[0] == name:
                values = [int(v) for v in fields[1:9]]
                user, nice, system, idle, iowait, irq, softirq, steal = values
                busy = user + nice + system + irq + softirq + steal
                return busy, busy + idle + iowait
        raise RuntimeError(f"no {name} in {self._proc / 'stat'}")

    def _group_ticks(self) -> int:
        ticks = 0
        for entry in os.scandir(self._proc):
            if not entry.name.isdigit():
                continue
            try:
                text = Path(entry.path, "stat").read_text()
            except OSError:
                continue  # the process ended while we looked
            # Fields after the command name, which is in parentheses and may hold spaces.
            fields = text[text.rfind(")") + 2 :].split()
            if int(fields[2]) == self._group:
                ticks += int(fields[11]) + int(fields[12])
        return ticks
