"""Peer routers, installed from PyPI into venvs of their own, and their commands.

Each peer lives in ``${PREFIXGATE_CACHE:-~/.cache/prefixgate}/peers/<name>``:
a virtual environment made with the running interpreter and the pinned
requirement installed by its ``pip``. A ``.installed`` file holding the
requirement marks success, so a second run re-uses the venv (idempotent);
a failed install leaves no marker and the error (pip's last lines) becomes
the contender's "unavailable" reason instead of stopping the benchmark.

The command lines were taken from each router's ``--help`` (vllm-router
0.1.17, sglang-router 0.3.2): loopback host, our port, ``--worker-urls``,
the policy, the Prometheus exporter on a free loopback port (both default to
29000, which two routers in a row could collide on), and a short
worker-startup check interval (the default 30 s would dominate a short run).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class PeerPackage:
    name: str
    requirement: str


VLLM_ROUTER = PeerPackage("vllm-router", "vllm-router==0.1.17")
SGLANG_ROUTER = PeerPackage("sglang-router", "sglang-router==0.3.2")


class PeerUnavailable(RuntimeError):
    """The peer could not be installed; the message says why."""


def cache_root() -> Path:
    configured = os.environ.get("PREFIXGATE_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "prefixgate"


def venv_dir(package: PeerPackage) -> Path:
    return cache_root() / "peers" / package.name


def ensure_installed(package: PeerPackage, timeout: float = 900.0) -> Path:
    """The peer's venv, created and installed on first use."""
    venv = venv_dir(package)
    marker = venv / ".installed"
    if marker.is_file() and marker.read_text().strip() == package.requirement:
        return venv
    venv.parent.mkdir(parents=True, exist_ok=True)
    steps = [[sys.executable, "-m", "venv", "--clear", str(venv)],
             [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
              "--disable-pip-version-check", package.requirement]]
    for step in steps:
        try:
            done = subprocess.run(step, check=False, capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PeerUnavailable(f"install of {package.requirement} failed: {exc}") from None
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-8:])
            raise PeerUnavailable(
                f"install of {package.requirement} failed ({' '.join(step[:3])} ...):\n{tail}")
    marker.write_text(package.requirement + "\n")
    return venv


def vllm_router_argv(venv: Path, port: int, metrics_port: int, workers: Sequence[str],
                     policy: str) -> list[str]:
    return [str(venv / "bin" / "vllm-router"), "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *workers, "--policy", policy,
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
            "--worker-startup-check-interval", "1", "--log-level", "warning"]


def sglang_router_argv(venv: Path, port: int, metrics_port: int, workers: Sequence[str],
                       policy: str) -> list[str]:
    return [str(venv / "bin" / "python"), "-m", "sglang_router.launch_router",
            "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers,
            "--policy", policy, "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(metrics_port), "--worker-startup-check-interval", "1",
            "--log-level", "warn"]
