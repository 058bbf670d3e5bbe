"""Simulated vLLM replicas as real subprocesses, for integration tests.

``SimProcess`` runs ``python -m engine.sim --host 127.0.0.1 --port P ...``,
waits until ``GET /health`` answers 200, and stops it with SIGTERM, then
SIGKILL if it lingers. ``stop()`` / ``start()`` take a replica down and bring
it back on the same port (failover tests). Its output goes to a temporary
log file whose tail is shown when start-up fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Self

import httpx

from tests.support.ports import free_port
from tests.support.waiting import wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]


class SimStartError(RuntimeError):
    pass


class SimProcess:
    def __init__(
        self,
        args: Sequence[str] = (),
        port: int | None = None,
        host: str = "127.0.0.1",
        startup_timeout: float = 60.0,
        python: str = sys.executable,
    ) -> None:
        self.args = list(args)
        self.host = host
        self.port = port if port is not None else free_port()
        self.startup_timeout = startup_timeout
        self.python = python
        self._process: subprocess.Popen[bytes] | None = None
        handle, path = tempfile.mkstemp(prefix=f"sim-{self.port}-", suffix=".log")
        os.close(handle)
        self.log_path = Path(path)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def v1_url(self) -> str:
        return f"{self.base_url}/v1"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def start(self) -> Self:
        if self.running:
            return self
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        command = [
            self.python,
            "-m",
            "engine.sim",
            "--host",
            self.host,
            "--port",
            str(self.port),
            *self.args,
        ]
        # The child keeps its own copy of the descriptor; ours can close at once.
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=REPO_ROOT,
                env=env,
            )
        self._wait_healthy()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout)

    def kill(self) -> None:
        """Die at once (SIGKILL), like a crashed replica: no graceful shutdown."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    def pause(self) -> None:
        """Stop answering (SIGSTOP), like a hung replica: connections are still accepted."""
        assert self._process is not None
        self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGCONT)

    def close(self) -> None:
        self.resume()
        self.stop()
        self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _wait_healthy(self) -> None:
        # Polled: the process offers no other readiness signal.
        with httpx.Client(timeout=2.0) as client:
            try:
                wait_until(lambda: self._healthy(client), self.startup_timeout, "sim /health")
            except AssertionError:
                self.stop()
                raise SimStartError(f"sim not healthy after {self.startup_timeout}s:\n"
                                    f"{self.log_tail()}") from None

    def _healthy(self, client: httpx.Client) -> bool:
        assert self._process is not None
        if self._process.poll() is not None:
            raise SimStartError(f"sim exited with {self._process.returncode}:\n{self.log_tail()}")
        try:
            return client.get(f"{self.base_url}/health").status_code == 200
        except httpx.TransportError:
            return False


@contextmanager
def running_sim(
    *args: str, port: int | None = None, startup_timeout: float = 60.0
) -> Iterator[SimProcess]:
    """``with running_sim("--time-scale", "20") as sim: ...`` -> a healthy replica."""
    process = SimProcess(args, port=port, startup_timeout=startup_timeout)
    try:
        yield process.start()
    finally:
        process.close()
