"""The pieces of ``python -m loadtest overhead`` that put the peer routers beside the
gateways: ``--peers`` parsing, the round order, a process tree's CPU time read from
a fake ``/proc``, and CPU per request as a ratio to the null proxy and each peer."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.cli import parser
from loadtest.contenders import ContenderSpec
from loadtest.overhead import (
    NULL_PROXY,
    PathFigures,
    parse_peers,
    round_order,
    side_by_side,
    with_peer_ratios,
)
from loadtest.proc_tree import descendants, parse_stat, read_stat, tree_cpu_ticks, tree_shape

SGLANG, VLLM = "sglang-router:cache_aware", "vllm-router:cache_aware"


def test_peers_argument_parsed_in_order() -> None:
    args = parser().parse_args(
        ["overhead", "--out", "x", "--peers", f"{SGLANG}, {VLLM}", "--rotate"])
    assert parse_peers(args.peers) == [ContenderSpec("sglang-router", "cache_aware"),
                                       ContenderSpec("vllm-router", "cache_aware")]
    assert args.rotate
    assert parse_peers(parser().parse_args(["overhead", "--out", "x"]).peers) == []


@pytest.mark.parametrize("text", ["prefixgate:prefix", "nginx:rr", f"{SGLANG},{SGLANG}"])
def test_peers_argument_rejects_what_is_not_a_peer(text: str) -> None:
    with pytest.raises(SystemExit, match="--peers"):
        parse_peers(text)


def test_round_order_rotates_by_one_per_round() -> None:
    names = ["direct", NULL_PROXY, "prefixgate:default", SGLANG]
    assert round_order(names, 0, rotate=False) == names
    assert round_order(names, 3, rotate=False) == names
    assert round_order(names, 1, rotate=True) == [NULL_PROXY, "prefixgate:default", SGLANG,
                                                  "direct"]
    assert round_order(names, 4, rotate=True) == names
    # over as many rounds as paths, every path runs last once
    assert {round_order(names, r, rotate=True)[-1] for r in range(4)} == set(names)


def _stat_line(pid: int, ppid: int, utime: int, stime: int, cutime: int = 0, cstime: int = 0,
               name: str = "sglang::router") -> str:
    # proc(5): pid (comm) state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt
    # cmajflt utime stime cutime cstime ...
    return (f"{pid} ({name}) S {ppid} {pid} {pid} 0 -1 4194560 100 0 0 0 "
            f"{utime} {stime} {cutime} {cstime} 20 0 5 0 123 4096 100\n")


def _fake_proc(root: Path, processes: dict[int, tuple[int, int, int, int, int, int]]) -> Path:
    """pid -> (ppid, utime, stime, cutime, cstime, threads)."""
    for pid, (ppid, utime, stime, cutime, cstime, threads) in processes.items():
        (root / str(pid) / "task").mkdir(parents=True)
        (root / str(pid) / "stat").write_text(
            _stat_line(pid, ppid, utime, stime, cutime, cstime, name="python (launcher) x"))
        for index in range(threads):
            (root / str(pid) / "task" / str(pid + index)).mkdir()
    (root / "self").mkdir()  # not a pid: skipped
    return root


def test_stat_parsed_past_a_name_with_spaces_and_parentheses() -> None:
    stat = parse_stat(42, _stat_line(42, 7, 150, 30, 5, 1, name="a (b) c"))
    assert (stat.ppid, stat.utime, stat.stime, stat.cutime, stat.cstime) == (7, 150, 30, 5, 1)


def test_tree_cpu_sums_the_launcher_its_descendants_and_reaped_children(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path, {
        1: (0, 0, 0, 0, 0, 1),           # init: not in the tree
        100: (1, 10, 5, 7, 3, 2),        # the launcher (reaped children: 7 + 3)
        101: (100, 200, 40, 0, 0, 5),    # the router it started
        102: (101, 1, 1, 0, 0, 1),       # the router's helper
        200: (1, 999, 999, 0, 0, 1),     # another process
    })
    stats = {pid: s for pid in (1, 100, 101, 102, 200) if (s := read_stat(pid, proc))}
    assert descendants(100, stats) == [100, 101, 102]
    assert tree_cpu_ticks(100, stats) == 15 + 240 + 2 + 10
    assert tree_cpu_ticks(102, stats) == 2
    assert tree_shape(100, proc) == {"processes": 3, "threads": 8}


def test_tree_cpu_of_a_gone_process_is_zero(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path, {5: (1, 3, 4, 0, 0, 1)})
    stat = read_stat(5, proc)
    assert stat is not None
    stats = {5: stat}
    assert read_stat(6, proc) is None
    assert tree_cpu_ticks(6, stats) == 0 and descendants(6, stats) == []


def _path(name: str, cpu: float | None, over_null: float | None = None) -> PathFigures:
    return PathFigures(name, 100, 0, 10.0, 20.0, 100.0, 200.0, 5.0,
                       outside_p50_ms=2.0, outside_p99_ms=9.0, cpu_ms_per_request=cpu,
                       cpu_over_null=over_null)


def test_cpu_ratio_to_each_peer_and_the_table() -> None:
    rows = [_path("direct", None), _path(NULL_PROXY, 2.0, 1.0),
            _path("prefixgate:default", 6.0, 3.0), _path(SGLANG, 4.0, 2.0),
            _path(VLLM, 3.0, 1.5)]
    rated = {p.name: p for p in with_peer_ratios(rows, [SGLANG, VLLM])}
    assert rated["direct"].cpu_over_peers is None
    assert rated["prefixgate:default"].cpu_over_peers == {SGLANG: 1.5, VLLM: 2.0}
    assert rated[SGLANG].cpu_over_peers == {SGLANG: 1.0, VLLM: 4.0 / 3.0}
    table = side_by_side(list(rated.values()), [SGLANG, VLLM])
    assert f"x {SGLANG}" in table.splitlines()[0] and f"x {VLLM}" in table.splitlines()[0]
    assert "| prefixgate:default | 2.00 / 9.00 | - | 100.0 / 200.0 | 5.00 | 6.00 | 3.00 | 1.50 " \
           "| 2.00 |" in table
    assert (f"- prefixgate:default CPU/request = 3.00x null proxy, 1.50x {SGLANG}, 2.00x {VLLM}"
            in table)
    assert f"- {SGLANG} CPU/request" not in table  # a peer's line would only restate the table


def test_cpu_ratio_skips_an_unmeasured_peer() -> None:
    rows = [_path("prefixgate:default", 6.0), _path(SGLANG, None)]
    rated = with_peer_ratios(rows, [SGLANG])
    assert rated[0].cpu_over_peers is None
    assert "| - |" in side_by_side(rated, [SGLANG])
