"""Which block table serves is said at start-up, in ``/ready`` and as a metric; the
pure-Python fallback (about 20x slower) is a warning, never silent."""

from __future__ import annotations

import logging

import pytest

from gateway.ops import block_table
from policies.block_table import compiled_available, default_backend

from .fake_replica import FakeReplica
from .test_gateway_core import gateway


def test_the_policies_name_the_table_they_build() -> None:
    assert default_backend() == ("compiled" if compiled_available() else "python")


def test_the_fallback_is_a_warning_at_start_up(monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(block_table, "default_backend", lambda: "python")
    with caplog.at_level(logging.INFO, logger="prefixgate"):
        assert block_table.report_block_table() == "python"
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert "pure-Python fallback" in record.getMessage() and "20x slower" in record.getMessage()


def test_the_compiled_table_is_one_info_line(monkeypatch: pytest.MonkeyPatch,
                                              caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(block_table, "default_backend", lambda: "compiled")
    with caplog.at_level(logging.INFO, logger="prefixgate"):
        block_table.report_block_table()
    [record] = caplog.records
    assert record.levelno == logging.INFO and "block table: compiled" in record.getMessage()


@pytest.mark.parametrize("backend", ["compiled", "python"])
async def test_ready_and_metrics_name_the_table(backend: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(block_table, "default_backend", lambda: backend)
    async with gateway([FakeReplica("a")], model="m") as client:
        ready = (await client.get("/ready")).json()
        metrics = (await client.get("/metrics")).text
    assert ready["block_table"] == backend
    assert f'prefixgate_block_table_info{{backend="{backend}"}} 1.0' in metrics
    assert metrics.count("prefixgate_block_table_info{") == 1


def test_a_relay_without_its_compiled_tap_is_a_warning(monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    assert block_table.report_relay() is True  # `make setup` built gateway._relay
    monkeypatch.setattr(block_table.importlib.util, "find_spec", lambda name: None)
    with caplog.at_level(logging.INFO, logger="prefixgate"):
        assert block_table.report_relay() is False
    [record] = caplog.records
    assert record.levelno == logging.WARNING and "gateway._relay was not built" in record.getMessage()
