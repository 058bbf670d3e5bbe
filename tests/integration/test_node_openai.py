"""The official Node ``openai`` package as the caller: chat, a stream, completions,
embeddings, the model list and an error, through the gateway in front of sims.

``scripts/setup-node.sh`` (run by ``make test``) installs the client at the version
``tests/node/package-lock.json`` pins; ``tests/node/drive.mjs`` makes the calls and
prints what each returned or raised.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.gateway import running_gateway

from .conftest import MODEL, gateway_settings, running_sims, sim_args

NODE_DIR = Path(__file__).resolve().parents[1] / "node"

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="no node on this machine")


def drive(base_url: str) -> dict:
    assert (NODE_DIR / "node_modules" / "openai").is_dir(), "run scripts/setup-node.sh"
    done = subprocess.run(["node", str(NODE_DIR / "drive.mjs"), base_url, MODEL, MODEL],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_node_client_works_through_the_gateway() -> None:
    with running_sims([sim_args(i) for i in range(2)]) as sims, \
            running_gateway(gateway_settings(sims, policy="prefix")) as gw:
        out = drive(gw.url + "/v1")
    failed = {k: v for k, v in out.items() if k != "unknown_model" and not v["ok"]}
    assert not failed, failed
    assert out["chat"]["content"] and out["chat"]["usage"]["completion_tokens"] > 0
    assert out["chat"]["replica"] in ("s0", "s1")
    stream = out["chat_stream"]
    assert stream["chunks"] > 1 and stream["content"]
    assert stream["usage"]["completion_tokens"] > 0
    assert out["completion"]["text"] and out["completion"]["usage"]["prompt_tokens"] > 0
    assert out["embeddings"]["count"] == 2 and out["embeddings"]["dims"] > 0
    assert out["models"]["ids"] == [MODEL]
    error = out["unknown_model"]
    assert (error["ok"], error["status"], error["type"]) == (False, 404, "NotFoundError")
    assert "no-such-model" in error["error"]["message"]
