"""A peer router counts as started once its ``/readiness`` reports every worker healthy."""

from __future__ import annotations

from loadtest.peer_ready import all_workers_ready


def test_ready_only_with_every_worker_healthy() -> None:
    assert all_workers_ready({"status": "ready", "healthy_workers": 2, "total_workers": 2}, 2)
    assert not all_workers_ready({"status": "ready", "healthy_workers": 1, "total_workers": 2}, 2)
    assert not all_workers_ready(
        {"status": "not ready", "reason": "insufficient healthy workers"}, 2)
    assert not all_workers_ready(["ready"], 1)
    assert not all_workers_ready({"status": "ready", "healthy_workers": "2"}, 2)
