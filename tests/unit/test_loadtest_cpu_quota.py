"""``loadtest.cpu_quota``: where a limited group is made and what is written to it.

A fake file-system root stands for ``/`` (the functions take it), with the
mount table and this process's cgroup lines as Linux writes them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.cpu_quota import (
    PERIOD_US,
    CoreQuota,
    Hierarchy,
    QuotaUnavailable,
    find_hierarchy,
    is_helper,
    serving_processes,
)

V1_MOUNTS = """tmpfs /sys/fs/cgroup tmpfs rw 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""
V1_GROUPS = "4:memory:/job/42\n1:cpu:/bench\n0::/\n"
V2_MOUNTS = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0\n"
V2_GROUPS = "0::/user.slice/bench\n"


def test_v1_cpu_hierarchy_under_this_process_group(tmp_path: Path) -> None:
    base = tmp_path / "sys/fs/cgroup/cpu/bench"
    base.mkdir(parents=True)
    (base / "cpu.cfs_quota_us").write_text("-1")
    assert find_hierarchy(V1_MOUNTS, V1_GROUPS, tmp_path) == Hierarchy(1, base)


def test_v2_needs_the_cpu_controller(tmp_path: Path) -> None:
    base = tmp_path / "sys/fs/cgroup/user.slice/bench"
    base.mkdir(parents=True)
    (base / "cgroup.controllers").write_text("memory pids\n")
    with pytest.raises(QuotaUnavailable, match="no cpu controller"):
        find_hierarchy(V2_MOUNTS, V2_GROUPS, tmp_path)
    (base / "cgroup.controllers").write_text("cpu memory pids\n")
    assert find_hierarchy(V2_MOUNTS, V2_GROUPS, tmp_path) == Hierarchy(2, base)


def test_limits_written_per_version_and_undone(tmp_path: Path) -> None:
    for version in (1, 2):
        base = tmp_path / f"v{version}"
        base.mkdir()
        (base / "cgroup.subtree_control").write_text("")
        (base / "cgroup.procs").write_text("")
        quota = CoreQuota(Hierarchy(version, base), 0.25)
        group = quota.limit(1234)
        if version == 1:
            assert (group / "cpu.cfs_period_us").read_text() == str(PERIOD_US)
            assert (group / "cpu.cfs_quota_us").read_text() == str(PERIOD_US // 4)
        else:
            assert (base / "cgroup.subtree_control").read_text() == "+cpu"
            assert (group / "cpu.max").read_text() == f"{PERIOD_US // 4} {PERIOD_US}"
        assert (group / "cgroup.procs").read_text() == "1234"
        for name in list(group.iterdir()):  # a real group's files go with it
            name.unlink()
        quota.close()
        assert (base / "cgroup.procs").read_text() == "1234"  # moved back
        assert not group.exists()


def test_the_serving_processes_are_a_supervisors_workers_or_the_process_itself() -> None:
    assert serving_processes(1, {1: 0, 2: 1, 3: 1}) == {2: [2], 3: [3]}  # two workers
    assert serving_processes(1, {1: 0}) == {1: [1]}  # one process
    # a worker's own helper is in the worker's group, not one of its own
    assert serving_processes(1, {1: 0, 2: 1, 3: 1, 4: 3}) == {2: [2], 3: [3, 4]}
    # one gateway process and the linter's process it started: one group, both in it
    assert serving_processes(1, {1: 0, 5: 1}, frozenset({5})) == {1: [1, 5]}


def test_the_linters_process_is_told_by_its_command_line(tmp_path: Path) -> None:
    for pid, argv in ((7, [".venv/bin/python", "-m", "gateway.server.lint_process", "3"]),
                      (8, [".venv/bin/prefixgate", "serve", "--port", "8000"])):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv))
    assert is_helper(7, tmp_path) and not is_helper(8, tmp_path)
    assert not is_helper(9, tmp_path)  # gone


@pytest.mark.parametrize("cores", [0, -1, 100])
def test_a_quota_outside_a_core_range_is_refused(cores: float) -> None:
    with pytest.raises(ValueError, match="core-quota"):
        CoreQuota(Hierarchy(1, Path("/nonexistent")), cores)
