"""``prefixgate demo`` against the no-install quick start: a hit, then what breaks it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.support.gateway import GatewayProcess
from tests.support.ports import free_port


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayProcess]:
    gw = GatewayProcess({"embedded": {"kind": "sim", "replicas": 2}, "health_interval": 0.2})
    try:
        yield gw.start(timeout=120)
    finally:
        gw.stop()


def demo(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway.cli", "demo", "--url", url], check=False,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})


ROW = re.compile(r"^(\d)\s+.+?\s{2,}(\S+)\s+([\d,—]+)\s+([\d,—]+)\s+(\d+) ms", re.MULTILINE)


def test_the_demo_shows_a_hit_and_the_timestamp_that_breaks_it(gateway: GatewayProcess) -> None:
    result = demo(gateway.url)
    assert result.returncode == 0, result.stderr
    rows = {int(m[1]): (m[2], int(m[3].replace(",", "")), int(m[4].replace(",", "")), int(m[5]))
            for m in ROW.finditer(result.stdout)}
    assert sorted(rows) == [1, 2, 3], result.stdout
    (first, matched1, cached1, _), (second, matched2, cached2, _) = rows[1], rows[2]
    assert (matched1, cached1) == (0, 0)  # a fresh run starts cold (its own cache_salt)
    assert second == first and matched2 > 500 and cached2 >= matched2  # the hit
    _, matched3, cached3, _ = rows[3]
    assert matched3 < 64 and cached3 < 64  # nothing after the timestamp is reused
    assert "timestamp 'Current time:" not in result.stdout  # the finding quotes the time only
    assert re.search(r"timestamp '\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC' at messages\[0\]",
                     result.stdout), result.stdout
    again = demo(gateway.url)  # and again: cold again, not a hit left by the first run
    assert re.search(r"^1\s.+\s0\s+0\s+\d+ ms", again.stdout, re.MULTILINE), again.stdout


def test_without_a_gateway_it_says_how_to_start_one() -> None:
    result = demo(f"http://127.0.0.1:{free_port()}")
    assert result.returncode == 2 and "prefixgate serve --embedded sim" in result.stderr
