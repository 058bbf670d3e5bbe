"""Start the real gateway as a subprocess on a free port, for integration tests."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence

import httpx
import yaml


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class GatewayProcess:
    def __init__(self, settings: dict, extra_args: Sequence[str] = (),
                 python: str = sys.executable, env: dict[str, str] | None = None) -> None:
        self.python = python
        self.env = env or {}
        self.port = _free_port()
        self.settings = {"host": "127.0.0.1", "port": self.port, **settings}
        self.extra_args = list(extra_args)
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self._config = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
        self.log_path = self._config.name + ".log"

    def start(self, wait_ready: bool = True, timeout: float = 60) -> GatewayProcess:
        yaml.safe_dump(self.settings, self._config)
        self._config.flush()
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [self.python, "-m", "gateway.cli", "serve", "--config", self._config.name,
             *self.extra_args],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1", **self.env})
        deadline = time.monotonic() + timeout
        path = "/ready" if wait_ready else "/health"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + path, timeout=1).status_code == 200:
                    return self
            time.sleep(0.1)
        raise RuntimeError(f"gateway not up in {timeout}s:\n{self.log()}")

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as handle:
            return handle.read()[-5000:]

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@contextlib.contextmanager
def running_gateway(settings: dict, extra_args: Sequence[str] = ()) -> Iterator[GatewayProcess]:
    gw = GatewayProcess(settings, extra_args)
    try:
        yield gw.start()
    finally:
        gw.stop()
