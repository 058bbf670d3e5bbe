"""Child processes of a benchmark: start, wait until healthy, stop — and only ours.

:class:`Service` runs one command in its own process group (``start_new_session``)
with output to a log file, polls an HTTP health URL until it answers 200,
and on ``stop`` sends SIGTERM to that group, then SIGKILL after a grace
period. Only the process group it started is ever signalled. Used for the
simulated replicas, the prefixgate gateway and the peer routers alike;
``log_tail`` is what a report quotes when something fails to start.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from engine.spawning import held_exit, stop_groups


def free_port() -> int:
    """An unused loopback port (released before returning; used right away)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class StartError(RuntimeError):
    """A service exited or never became healthy; the message has its log tail."""


@dataclass
class Service:
    name: str
    argv: Sequence[str]
    health_url: str
    log_path: Path
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> Service:
        self.launch()
        self.wait_healthy(timeout)
        return self

    def launch(self) -> None:
        """Start the process without waiting (see :meth:`wait_healthy`)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # held: a SIGTERM's exit (loadtest.cli) waits until the child is self.process,
        # which the way out stops, not a child of no one's in a group of its own
        with self.log_path.open("ab") as log, held_exit():
            self.process = subprocess.Popen(
                list(self.argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, env={**os.environ, **self.env}, cwd=self.cwd)

    def wait_healthy(self, timeout: float = 60.0) -> None:
        """Poll the health URL; on failure the process is stopped and StartError raised."""
        try:
            self._poll_health(timeout)
        except StartError:
            self.stop()
            raise

    def _poll_health(self, timeout: float) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                code = self.process.poll()
                if code is not None:
                    raise StartError(f"{self.name} exited with code {code}:\n{self.log_tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(self.health_url).status_code == 200:
                        return
                time.sleep(0.1)  # readiness poll: no other signal from the child
        raise StartError(f"{self.name} not healthy after {timeout:.0f}s:\n{self.log_tail()}")

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace: float = 10.0) -> None:
        process, self.process = self.process, None
        if process is not None:
            stop_groups([process], grace)


class ServiceGroup(contextlib.AbstractContextManager["ServiceGroup"]):
    """Services stopped together, in reverse start order, on exit."""

    def __init__(self) -> None:
        self.services: list[Service] = []

    def start(self, service: Service, timeout: float = 60.0) -> Service:
        self.services.append(service)
        return service.start(timeout)

    def start_all(self, services: Sequence[Service], timeout: float = 60.0) -> None:
        """Launch all at once (they start in parallel), then wait for each."""
        for service in services:
            self.services.append(service)
            service.launch()
        for service in services:
            service.wait_healthy(timeout)

    def __exit__(self, *exc: object) -> None:
        for service in reversed(self.services):
            service.stop()
        self.services.clear()
