"""`prefixgate serve` with nothing configured: real vLLM-on-CPU replicas, real answers.

The embedded default starts two vLLM-on-CPU replicas of SmolLM2-135M-Instruct
(converted once by ``deploy/vllm-cpu/setup.sh``) behind the gateway, which is
what a newcomer gets from ``make run``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

import openai
import pytest
from openai.types.chat import ChatCompletionSystemMessageParam

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
        system: ChatCompletionSystemMessageParam = {
            "role": "system",
            "content": "You are a concise, helpful assistant. Answer in one sentence."}
        reply = client.chat.completions.create(
            model="smollm2", temperature=0, max_tokens=20,
            messages=[system, {"role": "user", "content": "What is the capital of France?"}])
        assert "Paris" in (reply.choices[0].message.content or "")
        stream = client.chat.completions.create(
            model="smollm2", temperature=0, max_tokens=20, stream=True,
            messages=[system, {"role": "user", "content": "What is the capital of Germany?"}])
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert "Berlin" in text
        readme_example_hits(client)
        the_demo_shows_a_hit_and_the_timestamp(gw.url)
    finally:
        gw.stop()


README_SYSTEM = (
    "You are the support assistant of Northwind Outfitters, a shop for outdoor "
    "equipment. Answer in one friendly sentence. Orders can be cancelled free of "
    "charge until they are packed, usually within two hours of payment. Unused items "
    "can be returned within thirty days of delivery, in their original packaging; "
    "refunds reach the original means of payment within five working days. Tents, "
    "sleeping bags and backpacks of our own brand have a five-year warranty, "
    "everything else two years.")


def readme_example_hits(client: openai.OpenAI) -> None:
    """The README's first example: the second question reuses the system prompt's blocks."""
    cached = []
    for question in ("Can I still cancel the order I placed an hour ago?",
                     "How long is the warranty on your own tents?"):
        reply = client.chat.completions.create(
            model="smollm2", temperature=0, max_tokens=40,
            messages=[{"role": "system", "content": README_SYSTEM},
                      {"role": "user", "content": question}])
        assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
        cached.append(reply.usage.prompt_tokens_details.cached_tokens)
    assert cached[1] is not None and cached[1] >= 64, cached  # at least two 32-token blocks


def the_demo_shows_a_hit_and_the_timestamp(url: str) -> None:
    result = subprocess.run([sys.executable, "-m", "gateway.cli", "demo", "--url", url],
                            check=False, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    rows = re.findall(r"^([123])\s.+?\s{2,}(\S+)\s+([\d,]+)\s+([\d,]+)\s+\d+ ms",
                      result.stdout, re.MULTILINE)
    assert [row[0] for row in rows] == ["1", "2", "3"], result.stdout
    assert rows[1][1] == rows[0][1] and int(rows[1][3].replace(",", "")) > 500  # the hit
    assert "timestamp '" in result.stdout and "move it to the last user message" in result.stdout
