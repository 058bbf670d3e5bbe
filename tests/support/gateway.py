"""Start the real gateway as a subprocess on a free port, for integration tests."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence

import httpx
import yaml

from tests.support.ports import free_port
from tests.support.waiting import wait_until


class GatewayProcess:
    def __init__(self, settings: dict, extra_args: Sequence[str] = (),
                 python: str = sys.executable, env: dict[str, str] | None = None) -> None:
        self.python = python
        self.env = env or {}
        self.port = free_port()
        self.settings = {"host": "127.0.0.1", "port": self.port, **settings}
        self.extra_args = list(extra_args)
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        handle, self.config_path = tempfile.mkstemp(prefix="gateway-", suffix=".yaml")
        os.close(handle)
        self.log_path = self.config_path + ".log"

    def start(self, wait_ready: bool = True, timeout: float = 60) -> GatewayProcess:
        with open(self.config_path, "w", encoding="utf-8") as config:
            yaml.safe_dump(self.settings, config)
        # The child keeps its own copy of the descriptor; ours can close at once.
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [self.python, "-m", "gateway.cli", "serve", "--config", self.config_path,
                 *self.extra_args],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "HF_HUB_OFFLINE": "1", **self.env})
        path = "/ready" if wait_ready else "/health"
        try:
            wait_until(lambda: self._answers(path), timeout, f"gateway {path}")
        except AssertionError:
            self.stop()
            raise RuntimeError(f"gateway not up in {timeout}s:\n{self.log()}") from None
        return self

    def _answers(self, path: str) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"gateway exited {self.proc.returncode}:\n{self.log()}")
        try:
            return httpx.get(self.url + path, timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

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


QUICK_START = {"embedded": {"kind": "sim", "replicas": 2, "time_scale": 50},
               "health_interval": 0.2}
"""``prefixgate serve --embedded sim``, two replicas, run fast: the no-install quick start."""


@contextlib.contextmanager
def running_gateway(settings: dict, extra_args: Sequence[str] = ()) -> Iterator[GatewayProcess]:
    gw = GatewayProcess(settings, extra_args)
    try:
        yield gw.start()
    finally:
        gw.stop()
