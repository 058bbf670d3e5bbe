"""A router's process tree and its CPU time, read from ``/proc`` (Linux).

A path of ``python -m loadtest overhead`` is measured by the CPU its router
spends, and a router need not be one process: a launcher may start the real
router as a child (and that one its own helpers). So the figure is the sum
over the tree rooted at the process the benchmark started: every live
descendant's user + system time (each process's figure covers all of its
threads, including those that have exited) plus the root's ``cutime`` and
``cstime`` (descendants that exited and were waited for). A child reaped
between two readings moves from the first term to the second, so the
difference of two readings stays the tree's CPU time in between.

What the peers are (vllm-router 0.1.17, sglang-router 0.3.2, checked with
``ps --forest`` and ``/proc/<pid>/task``): each is one process, a Python
launcher that loads the Rust router as an extension module and runs it in
the same process (it renames itself ``vllm::router`` / ``sglang::router``;
4-5 threads idle, the Tokio runtime's workers among them), with no child
processes. The tree is then that one process; the sum is what keeps the
figure right if a version starts a child.

Every function takes the ``/proc`` root so the tests can hand it a fake one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True, slots=True)
class ProcStat:
    pid: int
    ppid: int
    utime: int
    stime: int
    cutime: int
    cstime: int
    """In clock ticks (``SC_CLK_TCK``), as ``/proc/<pid>/stat`` gives them."""


def parse_stat(pid: int, text: str) -> ProcStat:
    """Fields of ``/proc/<pid>/stat`` (the command name, in parentheses, may hold spaces)."""
    fields = text.rpartition(")")[2].split()
    # After the name, fields[0] is the state (field 3 of proc(5)): ppid is field 4,
    # utime, stime, cutime, cstime fields 14-17.
    return ProcStat(pid, int(fields[1]), int(fields[11]), int(fields[12]), int(fields[13]),
                    int(fields[14]))


def read_stat(pid: int, proc: Path = PROC) -> ProcStat | None:
    """The process's stat, or ``None`` when it is gone (or unreadable)."""
    try:
        return parse_stat(pid, (proc / str(pid) / "stat").read_text(encoding="ascii"))
    except (OSError, ValueError, IndexError):
        return None


def all_stats(proc: Path = PROC) -> dict[int, ProcStat]:
    stats = {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            stat = read_stat(int(entry.name), proc)
            if stat is not None:
                stats[stat.pid] = stat
    return stats


def descendants(root: int, stats: dict[int, ProcStat]) -> list[int]:
    """``root`` and every live process below it, parents before children."""
    children: dict[int, list[int]] = {}
    for stat in stats.values():
        children.setdefault(stat.ppid, []).append(stat.pid)
    tree, stack = [], [root] if root in stats else []
    while stack:
        pid = stack.pop()
        tree.append(pid)
        stack.extend(sorted(children.get(pid, []), reverse=True))
    return tree


def tree_cpu_ticks(root: int, stats: dict[int, ProcStat]) -> int:
    """User + system ticks of the tree: live members, plus the children the root reaped."""
    tree = descendants(root, stats)
    if not tree:
        return 0
    own = sum(stats[pid].utime + stats[pid].stime for pid in tree)
    return own + stats[root].cutime + stats[root].cstime


def tree_cpu_seconds(root: int, proc: Path = PROC) -> float:
    """CPU seconds (user + system, all threads, all descendants) of the tree under ``root``."""
    return tree_cpu_ticks(root, all_stats(proc)) / os.sysconf("SC_CLK_TCK")


def tree_shape(root: int, proc: Path = PROC) -> dict[str, int]:
    """How many processes and threads the tree has now: what a report says was measured."""
    tree = descendants(root, all_stats(proc))
    threads = 0
    for pid in tree:
        try:
            threads += len(os.listdir(proc / str(pid) / "task"))
        except OSError:
            continue
    return {"processes": len(tree), "threads": threads}


def tree_threads(root: int, proc: Path = PROC) -> list[int]:
    """Every thread id of every process in the tree (affinity is per thread on Linux)."""
    tids = []
    for pid in descendants(root, all_stats(proc)):
        try:
            tids += [int(tid) for tid in os.listdir(proc / str(pid) / "task")]
        except OSError:
            continue
    return tids
