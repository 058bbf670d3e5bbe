"""Headless Chromium driven over the Chrome DevTools Protocol, for browser tests.

Debian's ``chromium`` (installed by ``scripts/setup-browser.sh``) is started
with ``--remote-debugging-port=0``; the port it picked is read from
``DevToolsActivePort`` in its throw-away profile, and the page target is
driven over one websocket (the ``websockets`` package that uvicorn already
brings). Commands are sent one at a time; events that arrive meanwhile are
kept in ``events`` so a test can read every request the page made.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Self

import httpx
from websockets.sync.client import ClientConnection, connect

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--hide-scrollbars", "--remote-debugging-address=127.0.0.1",
         "--remote-debugging-port=0")


class CDPError(RuntimeError):
    pass


class Chromium:
    def __init__(self, width: int = 1400, height: int = 1000) -> None:
        self.width, self.height = width, height
        self.profile = Path(tempfile.mkdtemp(prefix="chromium-profile-"))
        self.events: list[dict[str, Any]] = []
        self._ids = itertools.count(1)
        self._proc: subprocess.Popen[bytes] | None = None
        self._ws: ClientConnection | None = None
        self._stack = contextlib.ExitStack()

    def start(self, timeout: float = 30.0) -> Self:
        try:
            return self._start(timeout)
        except BaseException:
            self.close()
            raise

    def _start(self, timeout: float) -> Self:
        stderr = self._stack.enter_context((self.profile / "stderr.log").open("wb"))
        self._proc = subprocess.Popen(
            [str(CHROMIUM), *FLAGS, f"--user-data-dir={self.profile}",
             f"--window-size={self.width},{self.height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=stderr)
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while not (port_file.exists() and port_file.read_text().strip()):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise CDPError("chromium did not start:\n" + self.stderr())
            time.sleep(0.05)  # the browser offers no other start-up signal
        port = int(port_file.read_text().split()[0])
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=5).json()
        page = next(t for t in targets if t["type"] == "page")
        ws = connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=10)
        self._stack.enter_context(ws)  # websockets 16 types __enter__ as its base class
        self._ws = ws
        return self

    def stderr(self) -> str:
        path = self.profile / "stderr.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def send(self, method: str, timeout: float = 30.0, **params: Any) -> dict[str, Any]:
        assert self._ws is not None, "start() first"
        ident = next(self._ids)
        self._ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            message = json.loads(self._ws.recv(timeout=max(deadline - time.monotonic(), 0.01)))
            if message.get("id") == ident:
                if "error" in message:
                    raise CDPError(f"{method}: {message['error']}")
                return message.get("result", {})
            if "method" in message:
                self.events.append(message)

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            raise CDPError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0) -> Any:
        """Evaluate until the expression is truthy; returns its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value or time.monotonic() > deadline:
                if not value:
                    raise AssertionError(f"timed out waiting for: {expression}")
                return value
            time.sleep(0.2)  # the page polls every 2 s; checking faster costs nothing

    def open(self, url: str, timeout: float = 30.0) -> None:
        """Navigate and return once the page's load event fired."""
        self.send("Network.enable")
        self.send("Page.enable")
        seen = len(self.events)
        self.send("Page.navigate", url=url)
        deadline = time.monotonic() + timeout
        while not any(e["method"] == "Page.loadEventFired" for e in self.events[seen:]):
            if time.monotonic() > deadline:
                raise CDPError(f"{url} did not load in {timeout}s")
            self.send("Runtime.evaluate", expression="0")  # collects events meanwhile
            time.sleep(0.05)

    def requested_urls(self) -> list[str]:
        return [e["params"]["request"]["url"] for e in self.events
                if e["method"] == "Network.requestWillBeSent"]

    def response_body(self, url_suffix: str, predicate: Any = None) -> str | None:
        """Body of the newest finished response whose URL ends with ``url_suffix``."""
        finished = {e["params"]["requestId"] for e in self.events
                    if e["method"] == "Network.loadingFinished"}
        ids = [e["params"]["requestId"] for e in self.events
               if e["method"] == "Network.responseReceived"
               and e["params"]["response"]["url"].endswith(url_suffix)
               and e["params"]["requestId"] in finished]
        for request_id in reversed(ids):
            result = self.send("Network.getResponseBody", requestId=request_id)
            body = (base64.b64decode(result["body"]).decode() if result.get("base64Encoded")
                    else result["body"])
            if predicate is None or predicate(body):
                return body
        return None

    def screenshot(self, path: Path) -> None:
        size = self.send("Page.getLayoutMetrics")["cssContentSize"]
        shot = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": size["width"],
                               "height": size["height"], "scale": 1})
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        self._ws = None
        self._stack.close()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
