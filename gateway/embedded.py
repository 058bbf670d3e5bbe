"""The embedded default: replicas the gateway starts itself when none are given.

``prefixgate serve`` with no replica configured starts ``embedded.replicas``
simulated vLLM replicas (``prefixgate sim``) as child processes on free
loopback ports, waits until each answers ``/health``, and stops them when the
gateway stops. It is the no-install quick start; real replicas are configured
with ``--replica`` or the config file.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx

from .config import EmbeddedSettings

log = logging.getLogger("prefixgate.embedded")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"replica at {url} exited with code {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"replica at {url} did not become healthy in {timeout:.0f}s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextlib.contextmanager
def simulated_replicas(cfg: EmbeddedSettings, tokenizer: str | None) -> Iterator[list[str]]:
    procs: list[subprocess.Popen[bytes]] = []
    urls: list[str] = []
    try:
        for index in range(cfg.replicas):
            port = free_port()
            args = [sys.executable, "-m", "engine.sim", "--host", "127.0.0.1",
                    "--port", str(port), "--served-model-name", cfg.model,
                    "--block-size", str(cfg.block_size), "--num-blocks", str(cfg.num_blocks),
                    "--time-scale", str(cfg.time_scale), "--seed", str(index)]
            if tokenizer:
                args += ["--tokenizer", tokenizer]
            procs.append(subprocess.Popen(args, start_new_session=True))
            urls.append(f"http://127.0.0.1:{port}")
        for url, proc in zip(urls, procs):
            wait_healthy(url, proc, timeout=60)
        log.info("embedded simulated replicas: %s", ", ".join(urls))
        yield urls
    finally:
        for proc in procs:
            stop(proc)
