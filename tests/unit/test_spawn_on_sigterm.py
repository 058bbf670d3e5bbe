"""A SIGTERM while the gateway (or a load test) starts its children stops every one spawned.

CI caught it: ``docker stop`` landing inside ``subprocess.Popen`` (after the fork,
before the child was recorded) exited the gateway past a replica nobody held,
which ran on in a session of its own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.spawning import exit_on_signal, held_exit
from gateway.config import EmbeddedSettings
from gateway.replicas import embedded
from loadtest import processes


@pytest.fixture
def sigterm_exits() -> Iterator[None]:
    previous = signal.signal(signal.SIGTERM, exit_on_signal)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.fixture
def spawned(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``subprocess.Popen`` starts a sleeper, then a SIGTERM arrives before it returns."""
    real_popen = subprocess.Popen
    children: list[subprocess.Popen[bytes]] = []

    def spawn_then_sigterm(args: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        child = real_popen([sys.executable, "-c", "import time; time.sleep(120)"], **kwargs)
        children.append(child)
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, before Popen returns
        return child

    monkeypatch.setattr(subprocess, "Popen", spawn_then_sigterm)
    try:
        yield children
    finally:
        for child in children:
            child.kill()
            child.wait()


def test_a_sigterm_just_after_a_replica_spawned_stops_that_replica(
        sigterm_exits: None, spawned: list[subprocess.Popen[bytes]]) -> None:
    with (pytest.raises(SystemExit) as exited,
          embedded.simulated_replicas(EmbeddedSettings(kind="sim", replicas=2), "tokenizer")):
        pytest.fail("the replicas were reported started")
    assert exited.value.code == 128 + signal.SIGTERM
    assert len(spawned) == 1  # the exit came before a second spawn
    assert spawned[0].poll() is not None, "the spawned replica runs on"


def test_a_sigterm_as_a_load_test_starts_its_services_stops_what_started(
        sigterm_exits: None, spawned: list[subprocess.Popen[bytes]], tmp_path: Path) -> None:
    services = [processes.Service(name, ["unused"], "http://127.0.0.1:9/health",
                                  tmp_path / f"{name}.log") for name in ("sim0", "sim1")]
    with pytest.raises(SystemExit), processes.ServiceGroup() as group:
        group.start_all(services)
    assert len(spawned) == 1
    assert spawned[0].poll() is not None, "the spawned service runs on"


def test_the_exit_comes_at_once_outside_a_hold_and_once_after_nested_holds(
        sigterm_exits: None) -> None:
    with pytest.raises(SystemExit):
        os.kill(os.getpid(), signal.SIGTERM)
        pytest.fail("the exit waited")
    after: list[str] = []
    with pytest.raises(SystemExit) as exited:
        with held_exit():
            with held_exit():
                os.kill(os.getpid(), signal.SIGTERM)
                after.append("inner")
            after.append("outer")
        after.append("past the hold")
    assert after == ["inner", "outer"]
    assert exited.value.code == 128 + signal.SIGTERM
    with held_exit():  # the deferred exit was spent: a later hold ends quietly
        pass
