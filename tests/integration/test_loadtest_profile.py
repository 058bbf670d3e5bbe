"""``python -m loadtest profile`` on a real gateway under load: py-spy attached from outside,
the samples filed under the request's stages."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import openai

from tests.support.gateway import GatewayProcess

from .conftest import MODEL, gateway_settings, running_sims, sim_args

REPO = Path(__file__).resolve().parents[2]
REQUEST_STAGES = {"receive", "parse", "render", "tokenize", "hash", "decide", "send", "relay",
                  "record", "metrics"}


def test_a_profile_of_a_busy_gateway_names_its_stages(tmp_path: Path) -> None:
    with running_sims([sim_args(i) for i in range(2)]) as sims:
        gw = GatewayProcess(gateway_settings(sims, policy="prefix")).start()
        done = threading.Event()

        def traffic() -> None:
            client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
            turn = 0
            while not done.is_set():
                turn += 1
                stream = client.chat.completions.create(
                    model=MODEL, stream=True, max_tokens=8, messages=[
                        {"role": "system", "content": "You answer questions about tea. " * 40},
                        {"role": "user", "content": f"question {turn}: which tea for {turn}?"}])
                for _ in stream:
                    pass

        workers = [threading.Thread(target=traffic, daemon=True) for _ in range(4)]
        try:
            for worker in workers:
                worker.start()
            assert gw.proc is not None
            done_profile = subprocess.run(
                [sys.executable, "-m", "loadtest", "profile", "--pid", str(gw.proc.pid),
                 "--duration", "5", "--out", str(tmp_path)],
                cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
        finally:
            done.set()
            for worker in workers:
                worker.join(timeout=30)
            gw.stop()
    assert done_profile.returncode == 0, done_profile.stderr[-2000:]
    document = json.loads((tmp_path / "stages.json").read_text())
    assert document["samples"] > 0
    # The gateway's time is found on the request path, not in "other".
    share = document["share"]
    assert len(REQUEST_STAGES & set(share)) >= 4, share
    assert share.get("other", 0) < 0.25, share
    assert (tmp_path / "profile.txt").stat().st_size > 0
    assert "| stage | share |" in (tmp_path / "stages.md").read_text()
