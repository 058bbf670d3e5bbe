"""The ops dashboard in a real browser, while traffic flows through the gateway.

Three simulated replicas behind the gateway; a background client streams a
workload with shared system prompts; one replica is stopped part-way. In
headless Chromium the test opens /dashboard and reads what a person would
see: each number sits in an element with ``data-replica``/``data-field`` and
its raw value in ``data-value``. The numbers must be those of the
/admin/replicas answer the page received, and — once traffic has stopped —
those a fresh /admin/replicas gives. The stopped replica must be marked
down. The page must make no request outside the gateway's origin. A
screenshot is left in ``artifacts/dashboard.png`` and in
``docs/img/dashboard.png``, the picture of the docs' ops view page.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import MODEL, gateway_settings, sim_args
from tests.support.chromium import CHROMIUM, Chromium
from tests.support.gateway import GatewayProcess
from tests.support.sim import SimProcess

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(),
                       reason="no /usr/bin/chromium: run scripts/setup-browser.sh"),
]

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
DOCS_SHOT = Path(__file__).resolve().parents[2] / "docs" / "img" / "dashboard.png"
"""The screenshot the docs show (docs/ops-view.md): every run takes it anew."""
SHOWN_FIELDS = ("predicted_hit_rate_1m", "actual_hit_rate_1m", "predicted_hit_rate_total",
                "actual_hit_rate_total", "ttft_p50_1m_s", "ttft_p99_1m_s", "requests_1m",
                "errors_1m", "inflight", "running", "waiting", "kv_usage", "block_size",
                "capacity_blocks", "indexed_blocks", "requests_total", "healthy", "model",
                "kv_cache_dtype", "tpot_p50_1m_s", "output_tokens_per_s_1m",
                "engine_ttft_p50_1m_s", "engine_itl_p50_1m_s", "pending_requests", "pending_prefill_tokens",
                "prefill_tokens_per_s", "assumed_prefill_tokens_per_s")
TOTAL_FIELDS = ("predicted_hit_rate_total", "actual_hit_rate_total", "requests_total")
WORDS = ("refund", "order", "invoice", "warranty", "account", "premium", "region", "cache",
         "block", "replica")
MAX_REQUESTS, MAX_SECONDS, PACE_SECONDS = 2000, 120.0, 0.05
"""Bounds of the background workload, whatever happens to the test."""


class Traffic:
    """Streams chat requests with 4 shared system prompts until stopped."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = threading.Event()
        self.sent = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Traffic:
        self._thread.start()
        return self

    def finish(self) -> None:
        self.stop.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        rng = random.Random(3)
        prompts = [f"You are assistant #{a}. " + " ".join(rng.choice(WORDS) for _ in range(250))
                   for a in range(4)]
        deadline = time.monotonic() + MAX_SECONDS
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while self.sent < MAX_REQUESTS and time.monotonic() < deadline:
                body = {"model": MODEL, "stream": True, "max_tokens": 8, "messages": [
                    {"role": "system", "content": prompts[self.sent % 4]},
                    {"role": "user", "content": f"question {self.sent}"}]}
                try:
                    with client.stream("POST", "/v1/chat/completions", json=body) as response:
                        response.read()
                except httpx.HTTPError:
                    pass  # a replica being stopped mid-request is part of the scene
                self.sent += 1
                if self.stop.wait(PACE_SECONDS):
                    return


@pytest.fixture(scope="module")
def sims() -> Iterator[list[SimProcess]]:
    procs = [SimProcess(sim_args(i)) for i in range(3)]
    try:
        for proc in procs:
            proc.start()
        yield procs
    finally:
        for proc in procs:
            proc.close()


@pytest.fixture(scope="module")
def gateway(sims: list[SimProcess]) -> Iterator[GatewayProcess]:
    gw = GatewayProcess(gateway_settings(sims, policy="prefix"))
    try:
        yield gw.start()
    finally:
        gw.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Chromium]:
    with Chromium(width=1400, height=1000) as chromium:
        yield chromium


SHOWN_JS = """
(() => {
  const out = {};
  for (const e of document.querySelectorAll('[data-replica][data-field]')) {
    (out[e.dataset.replica] ||= {})[e.dataset.field] = JSON.parse(e.dataset.value ?? 'null');
  }
  return out;
})()
"""


def shown(browser: Chromium) -> dict[str, dict]:
    value = browser.evaluate(SHOWN_JS)
    assert isinstance(value, dict)
    return value


def polls(browser: Chromium) -> int:
    return int(browser.evaluate("Number(document.body.dataset.polls || 0)"))


def wait_next_poll(browser: Chromium) -> None:
    after = polls(browser) + 1
    browser.wait_for(f"Number(document.body.dataset.polls || 0) >= {after}", timeout=15)


CHARTS = ("hit", "load", "kv", "ttft", "tokens")

LINES_JS = """
(() => {
  const out = {};
  for (const svg of document.querySelectorAll('svg[data-chart]')) {
    const lines = [...svg.querySelectorAll('polyline')].map(line => {
      const box = line.getBBox();
      return {stroke: line.getAttribute('stroke'), width: box.width, top: box.y,
              colour: CSS.supports('color', line.getAttribute('stroke'))};
    });
    (out[svg.dataset.replica] ||= {})[svg.dataset.chart] = lines;
  }
  return out;
})()
"""


def drawn_lines(browser: Chromium) -> dict[str, dict[str, list[dict]]]:
    value = browser.evaluate(LINES_JS)
    assert isinstance(value, dict)
    return value


def every_chart_draws(lines: dict[str, dict[str, list[dict]]], replicas: list[str]) -> bool:
    """Each chart of each replica has a coloured line across time, and output tokens/s
    rose above zero (the plot's floor is at y = 94)."""
    for replica in replicas:
        for chart in CHARTS:
            drawn = [line for line in lines.get(replica, {}).get(chart, [])
                     if line["colour"] and line["width"] > 0]
            if not drawn:
                return False
        if min(line["top"] for line in lines[replica]["tokens"]) >= 93:
            return False
    return True


def admin(gateway: GatewayProcess) -> dict:
    return httpx.get(gateway.url + "/admin/replicas").json()


def test_dashboard_shows_what_admin_replicas_says(
        gateway: GatewayProcess, sims: list[SimProcess], browser: Chromium) -> None:
    traffic = Traffic(gateway.url).start()
    try:
        browser.open(gateway.url + "/dashboard")
        browser.wait_for("Number(document.body.dataset.polls || 0) >= 1", timeout=20)
        # Let history build up: some hit-rate chart lines need two points.
        browser.wait_for("document.querySelectorAll('svg[data-chart=hit] polyline').length >= 2",
                         timeout=30)
        first = shown(browser)
        wait_next_poll(browser)
        wait_next_poll(browser)
        second = shown(browser)
        assert sum(r["requests_total"] for r in second.values()) > \
            sum(r["requests_total"] for r in first.values()), "the page is not live"

        # Every chart draws a visible line: output tokens/s too, although these
        # streams do not ask for usage (the replica's own count is shown).
        deadline = time.monotonic() + 30
        while not every_chart_draws(lines := drawn_lines(browser), ["s0", "s1", "s2"]):
            assert time.monotonic() < deadline, f"charts without a visible line: {lines}"
            wait_next_poll(browser)
        assert browser.evaluate(
            "document.querySelectorAll('[data-legend=down]').length") == 3 * len(CHARTS)

        # What is shown is exactly the /admin/replicas answer the page last received.
        generated_at = browser.evaluate("document.body.dataset.generatedAt")
        body = browser.response_body(
            "/admin/replicas", lambda text: str(json.loads(text)["generated_at"]) == generated_at)
        assert body is not None, "the page's own /admin/replicas response was not seen"
        answer = json.loads(body)
        received = {r["id"]: r for r in answer["replicas"]}
        now_shown = shown(browser)
        for replica_id, replica in received.items():
            for field in SHOWN_FIELDS:
                assert now_shown[replica_id][field] == replica[field], (replica_id, field)
        # The gateway's own load, above the cards: busy while traffic flows, as answered.
        load = browser.evaluate("""Object.fromEntries(Array.from(
            document.querySelectorAll('#gateway-load [data-field]'),
            e => [e.dataset.field.slice('gateway.'.length), JSON.parse(e.dataset.value)]))""")
        assert load == {k: answer["gateway"][k] for k in load}, (load, answer["gateway"])
        assert {"cpu_cores_1m", "loop_lag_p99_1m_s", "requests_preparing",
                "requests_open"} <= set(load)
        assert load["cpu_cores_1m"] > 0 and load["loop_lag_p99_1m_s"] is not None, load

        sims[2].stop()
        browser.wait_for("document.querySelector('#replica-s2')?.dataset.healthy === 'false'",
                         timeout=20)
        browser.wait_for("document.querySelectorAll("
                         "'svg[data-replica=s2] rect[data-band=down]').length > 0", timeout=20)
    finally:
        traffic.finish()

    # Traffic over: once the counters settle, a fresh /admin/replicas and the
    # page (after its next poll) agree on every total.
    settled = _settled(gateway)
    wait_next_poll(browser)
    wait_next_poll(browser)
    page = shown(browser)
    for replica in settled["replicas"]:
        for field in TOTAL_FIELDS:
            assert page[replica["id"]][field] == replica[field], (replica["id"], field)
    assert any(r["actual_hit_rate_total"] and r["actual_hit_rate_total"] > 0.5
               for r in settled["replicas"]), "the shared prompts should hit"

    down = browser.evaluate("""(() => {
        const card = document.querySelector('#replica-s2');
        return {cls: card.className, badge: card.querySelector('.badge').textContent,
                error: card.querySelector('[data-field=last_error]').textContent};
    })()""")
    assert "down" in down["cls"].split() and down["badge"] == "DOWN"
    assert down["error"].startswith("last error:")
    assert browser.evaluate("document.querySelector('[data-field=replicas_healthy]').textContent") \
        == "2"

    shot = ARTIFACTS / "dashboard.png"
    browser.screenshot(shot)
    assert shot.stat().st_size > 20_000
    DOCS_SHOT.parent.mkdir(parents=True, exist_ok=True)
    DOCS_SHOT.write_bytes(shot.read_bytes())

    origin = gateway.url + "/"
    foreign = [url for url in browser.requested_urls()
               if not url.startswith(origin) and not url.startswith(("data:", "about:"))]
    assert not foreign, f"the page reached outside the gateway: {foreign}"
    assert any(url.endswith("/admin/replicas") for url in browser.requested_urls())


def _settled(gateway: GatewayProcess, timeout: float = 20.0) -> dict:
    """/admin/replicas once two answers a poll apart agree on every total."""
    deadline = time.monotonic() + timeout
    previous = admin(gateway)
    while time.monotonic() < deadline:
        time.sleep(0.5)  # the gateway re-reads its replicas every 0.2 s
        current = admin(gateway)
        key = [(r["requests_total"], r["cache_hits_tokens_total"],
                r["cache_queries_tokens_total"]) for r in current["replicas"]]
        if key == [(r["requests_total"], r["cache_hits_tokens_total"],
                    r["cache_queries_tokens_total"]) for r in previous["replicas"]]:
            return current
        previous = current
    raise AssertionError("the replicas' counters did not settle")
