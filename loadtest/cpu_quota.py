"""A share of one core for each serving process of a router (Linux cgroups).

``python -m loadtest overhead --core-quota 0.1`` models a machine where every
serving process of a router has a core of its own and the replica and the
load generator have room to spare, on a box that has neither: each serving
process gets ``0.1`` of a core by a CFS bandwidth limit, so the routers are
the bottleneck at saturation and the replica and the load generator (not
limited) keep up. Throughput at saturation then scales with the cores a
router is given: ``prefixgate serve --workers 2`` gets two such shares
against one worker's one, and what the two workers' sharing costs shows as a
ratio under 2.

Which processes are serving processes: the children of the process the
benchmark started, or that process when it has none (helpers aside: the live
prompt linter's own process, ``HELPER_MARK``, goes in the group of the process
that started it). A single-process router
(one gateway worker, the null proxy, a Rust peer with its threads) is
limited as a whole; ``--workers N`` is a supervisor (its hub) with N workers
under it, and only the workers are limited, each in a group of its own. The
supervisor keeps what it needs of the spare cores, as it would on a larger
machine; its CPU still counts in the path's CPU per request.

Both cgroup versions are handled: v1's ``cpu`` hierarchy
(``cpu.cfs_quota_us``/``cpu.cfs_period_us``) and v2 where the ``cpu``
controller can be enabled below this process's own group (``cpu.max``).
Each limited process gets a group of its own under the group this process is
in; on exit every process still alive is moved back and the groups removed.
Every function takes the file-system roots so the tests can use a fake tree.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

PERIOD_US = 10_000
"""The bandwidth period: a limited process runs at most ``cores x 10 ms`` in every
10 ms (the default period, 100 ms, would stop a 0.1-core process for 90 ms at a
time: the same throughput, stalls ten times as long)."""


class QuotaUnavailable(RuntimeError):
    """No cgroup hierarchy with a writable CPU controller here."""


@dataclass(frozen=True, slots=True)
class Hierarchy:
    version: int
    """1 or 2."""
    base: Path
    """The group this process is in, where the limited groups are made."""


def _mounts(mounts_text: str) -> list[tuple[str, str, set[str]]]:
    """``(fstype, mount point, options)`` of every cgroup mount."""
    found = []
    for line in mounts_text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
            found.append((parts[2], parts[1], set(parts[3].split(","))))
    return found


def _own_group(cgroup_text: str, version: int) -> str:
    """This process's group path in the v1 ``cpu`` hierarchy or in v2's."""
    for line in cgroup_text.splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if version == 2 and hier == "0" and controllers == "":
            return path
        if version == 1 and "cpu" in controllers.split(","):
            return path
    return "/"


def find_hierarchy(mounts_text: str | None = None, cgroup_text: str | None = None,
                   root: Path = Path("/")) -> Hierarchy:
    """Where groups with a CPU limit can be made, v1's ``cpu`` hierarchy first.

    Raises :class:`QuotaUnavailable` with what was missing."""
    if mounts_text is None:
        mounts_text = (root / "proc/self/mounts").read_text(encoding="utf-8")
    if cgroup_text is None:
        cgroup_text = (root / "proc/self/cgroup").read_text(encoding="utf-8")
    tried = []
    for fstype, point, options in _mounts(mounts_text):
        if fstype == "cgroup" and "cpu" in options:
            base = root / point.lstrip("/") / _own_group(cgroup_text, 1).lstrip("/")
            if (base / "cpu.cfs_quota_us").exists() and os.access(base, os.W_OK):
                return Hierarchy(1, base)
            tried.append(f"{base} (v1, not writable)")
    for fstype, point, _options in _mounts(mounts_text):
        if fstype == "cgroup2":
            base = root / point.lstrip("/") / _own_group(cgroup_text, 2).lstrip("/")
            controllers = base / "cgroup.controllers"
            if controllers.exists() and "cpu" in controllers.read_text().split() \
                    and os.access(base, os.W_OK):
                return Hierarchy(2, base)
            tried.append(f"{base} (v2, no cpu controller)")
    raise QuotaUnavailable("no cgroup CPU controller this process may write to"
                           + (": tried " + ", ".join(tried) if tried else ""))


HELPER_MARK = "gateway.server.lint_process"
"""In a helper process's command line: the live prompt linter's own process, which a
gateway process starts (``lint.worker: process``). It is limited with the process that
started it (in its group), never as a serving process of its own."""


def serving_processes(root: int, parents: dict[int, int],
                      helpers: frozenset[int] = frozenset()) -> dict[int, list[int]]:
    """A router's serving processes, each with the processes under it (they share its
    group): the root's children that are not helpers when it has any (a supervisor's
    workers), else the root itself (a single process, with its helpers)."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)

    def with_below(pid: int) -> list[int]:
        out, stack = [], [pid]
        while stack:
            out.append(stack.pop())
            stack.extend(sorted(children.get(out[-1], []), reverse=True))
        return out

    workers = sorted(pid for pid in children.get(root, []) if pid not in helpers)
    return {pid: with_below(pid) for pid in workers or [root]}


def is_helper(pid: int, proc: Path = Path("/proc")) -> bool:
    """Whether ``pid``'s command line names a helper (``HELPER_MARK``)."""
    try:
        return HELPER_MARK in (proc / str(pid) / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


@dataclass
class CoreQuota:
    """Groups with a CPU limit, one per limited process; ``close`` undoes them."""

    hierarchy: Hierarchy
    cores: float
    groups: dict[int, Path] = field(default_factory=dict)
    members: dict[int, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0 < self.cores <= 64:
            raise ValueError(f"--core-quota must be in (0, 64], got {self.cores}")
        if self.hierarchy.version == 2:
            # The cpu controller must be on in the base group's children.
            control = self.hierarchy.base / "cgroup.subtree_control"
            if "cpu" not in control.read_text().split():
                control.write_text("+cpu")

    def limit(self, pid: int, members: tuple[int, ...] = ()) -> Path:
        """``pid`` (all its threads) in a group of its own, limited to ``cores`` of a core,
        with ``members`` (the processes it started) in it too."""
        group = self.hierarchy.base / f"loadtest-quota-{os.getpid()}-{pid}"
        group.mkdir(exist_ok=True)
        quota = max(1_000, round(self.cores * PERIOD_US))
        if self.hierarchy.version == 1:
            (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (group / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        for member in dict.fromkeys((pid, *members)):
            (group / "cgroup.procs").write_text(str(member))
            self.members.setdefault(pid, []).append(member)
        self.groups[pid] = group
        return group

    def throttled(self) -> dict[int, int]:
        """Per limited process: how many periods it was stopped in for its quota."""
        counts = {}
        for pid, group in self.groups.items():
            with contextlib.suppress(OSError, ValueError):
                for line in (group / "cpu.stat").read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "nr_throttled":
                        counts[pid] = int(value)
        return counts

    def close(self) -> None:
        for pid, group in self.groups.items():
            for member in self.members.get(pid, [pid]):
                with contextlib.suppress(OSError):
                    (self.hierarchy.base / "cgroup.procs").write_text(str(member))
            with contextlib.suppress(OSError):
                group.rmdir()
        self.groups.clear()
        self.members.clear()
