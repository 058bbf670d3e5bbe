"""The gateway checks that its replicas render prompts to the token ids it routes on: a
replica whose template is another (vLLM's --chat-template) is reported, not silently
missed (gateway.prompt.render_check)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from engine.tokenizer import bundled_qwen_tokenizer_dir
from tests.support.gateway import GatewayProcess
from tests.support.sim import SimProcess, running_sim
from tests.support.waiting import wait_until

QWEN_DIR = bundled_qwen_tokenizer_dir()
MODEL = "qwen-sim"
BRACKETS = ("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant] {% endif %}")


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    assert QWEN_DIR is not None
    with running_sim("--tokenizer", QWEN_DIR, "--time-scale", "50",
                     "--served-model-name", MODEL) as process:
        yield process


def checks(gw: GatewayProcess) -> dict:
    found: dict = {}

    def done() -> bool:
        ready = httpx.get(gw.url + "/ready", timeout=10).json()
        found.update(ready["tokenizers"].get(MODEL, {}).get("render_checks") or {})
        return bool(found)
    wait_until(done, 30, "a render check")
    return found


@pytest.mark.parametrize("template", [None, BRACKETS], ids=["same", "another"])
def test_a_replica_that_renders_other_token_ids_is_reported(
        sim: SimProcess, template: str | None) -> None:
    model = {"name": MODEL, "tokenizer": QWEN_DIR, "chat_template": template}
    gw = GatewayProcess({"replicas": [{"id": "r0", "url": sim.base_url}], "models": [model],
                         "policy": "prefix"})
    try:
        gw.start()
        (check,) = checks(gw).items()
        metrics = httpx.get(gw.url + "/metrics", timeout=10).text
        if template is None:
            assert check[0] == "r0" and check[1]["result"] == "match", check
            assert "5 probes" in check[1]["detail"]
            assert f'prefixgate_render_check{{model="{MODEL}",replica="r0",result="match"}} 1.0' \
                in metrics
        else:
            assert check[1]["result"] == "differs", check
            assert "token 0 differs" in check[1]["detail"]
            assert 'result="differs"' in metrics
            log = gw.log()
            assert "replica r0 renders prompts to other token ids" in log
            assert "--chat-template" in log
            assert "Where is my parcel" not in log  # the probes' text is not logged either
    finally:
        gw.stop()
