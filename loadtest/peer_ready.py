"""Waiting until a peer router can route to every worker, not just until it listens.

sglang-router 0.3.2 answers ``GET /health`` with 200 as soon as it listens,
while it is still registering its workers (it probes each for gRPC, then
``/server_info``, ``/model_info``...). Against real vLLM-on-CPU replicas that
took about 3.5 s, and every request sent meanwhile got ``503 No available
workers``. Both peers (vllm-router 0.1.17 is a fork) have
``GET /readiness``: ``{"status": "ready", "healthy_workers": H,
"total_workers": T}`` with 200, or 503 ``not ready``. A comparison waits
until all of its workers are healthy there, so no peer starts a run with
fewer replicas than the others.
"""

from __future__ import annotations

import contextlib
import time

import httpx


class PeerNotReady(RuntimeError):
    """The router did not report every worker healthy in time; says what it did report."""


def all_workers_ready(body: object, workers: int) -> bool:
    """Whether a ``/readiness`` answer counts ``workers`` healthy workers."""
    if not isinstance(body, dict) or body.get("status") != "ready":
        return False
    healthy = body.get("healthy_workers")
    return isinstance(healthy, int) and healthy >= workers


def wait_all_workers(url: str, workers: int, timeout: float = 60.0) -> None:
    """Poll ``url/readiness`` until ``workers`` workers are healthy; raise after ``timeout``."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                response = client.get(url + "/readiness")
                last = f"{response.status_code} {response.text[:200]}"
                if response.status_code == 200 and all_workers_ready(response.json(), workers):
                    return
            time.sleep(0.1)  # readiness poll: the router gives no other signal
    raise PeerNotReady(f"{url}/readiness never counted {workers} healthy workers: {last}")
