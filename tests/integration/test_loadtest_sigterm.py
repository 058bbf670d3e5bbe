"""A killed comparison takes down the replicas and routers it started.

Each replica and router of ``python -m loadtest compare`` runs in its own
process group, so a SIGTERM to the command (a suite killed, a CI timeout)
reaches none of them unless the command stops them itself on the way out.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline:
            found.append(int(entry.name))
    return found


def test_sigterm_stops_every_replica_and_router_it_started(tmp_path: Path) -> None:
    out = tmp_path / "run"
    command = [
        sys.executable, "-m", "loadtest", "compare", "--replicas", "sim:2",
        "--replica-args", "--num-blocks 256 --time-scale 1", "--warmup", "0",
        "--workload", "shared-prefix", "--groups", "4", "--prompts-per-group", "200",
        "--system-len", "64", "--question-len", "8", "--output-len", "64",
        "--concurrency", "2", "--contenders", "prefixgate:least_load",
        "--max-duration", "300", "--out", str(out),
    ]
    driver = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})
    config = out / "logs" / "prefixgate-least_load.yaml"
    sims: list[int] = []
    gateways: list[int] = []
    try:
        deadline = time.monotonic() + 180
        while not _processes_mentioning(str(config)):
            assert driver.poll() is None, "the comparison ended before its gateway started"
            assert time.monotonic() < deadline, "the gateway never started"
            time.sleep(0.5)
        time.sleep(2)  # requests flowing
        sims = [pid for pid in _processes_mentioning("-m engine.sim")
                if _parent(pid) == driver.pid]
        gateways = _processes_mentioning(str(config))
        assert len(sims) == 2 and gateways
        driver.send_signal(signal.SIGTERM)
        assert driver.wait(timeout=60) != 0
    finally:
        if driver.poll() is None:
            driver.kill()
    # The gateway and the two simulated replicas it started are gone (each ran in
    # its own process group: only the driver could stop them).
    deadline = time.monotonic() + 15
    while any(_alive(pid) for pid in sims + gateways) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [pid for pid in sims + gateways if _alive(pid)] == []


def _parent(pid: int) -> int | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    return None


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "State:\tZ" not in status
