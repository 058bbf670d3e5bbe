"""`prefixgate serve` with nothing configured: real vLLM-on-CPU replicas, real answers.

The embedded default starts two vLLM-on-CPU replicas of SmolLM2-135M-Instruct
(converted once by ``deploy/vllm-cpu/setup.sh``) behind the gateway, which is
what a newcomer gets from ``make run``.
"""

from __future__ import annotations

import time

import openai
import pytest

from tests.support.gateway import GatewayProcess

from .conftest import setup_or_skip

pytestmark = pytest.mark.e2e


def test_make_run_default_gives_real_answers() -> None:
    setup_or_skip()
    gw = GatewayProcess({"health_interval": 0.5})
    started = time.monotonic()
    try:
        gw.start(timeout=400)
        print(f"\nembedded default (2 real SmolLM2 replicas) ready in "
              f"{time.monotonic() - started:.0f}s")
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0, timeout=120)
        assert [m.id for m in client.models.list()] == ["smollm2"]
        system = {"role": "system", "content": "You are a concise, helpful assistant. "
                                               "Answer in one sentence."}
        reply = client.chat.completions.create(
            model="smollm2", temperature=0, max_tokens=20,
            messages=[system, {"role": "user", "content": "What is the capital of France?"}])
        assert "Paris" in (reply.choices[0].message.content or "")
        stream = client.chat.completions.create(
            model="smollm2", temperature=0, max_tokens=20, stream=True,
            messages=[system, {"role": "user", "content": "What is the capital of Germany?"}])
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert "Berlin" in text
    finally:
        gw.stop()
