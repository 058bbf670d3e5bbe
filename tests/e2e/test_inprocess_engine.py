"""An in-process vLLM engine replica beside a remote one (a mixed pool).

The gateway runs in the vLLM-on-CPU venv (prefixgate installed there by
``scripts/test.sh``) with one ``kind: inprocess`` replica built from engine
arguments and one remote vLLM server.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from engine.vllm.local import LaunchSpec, running_replicas
from tests.support.gateway import GatewayProcess

from .conftest import MODEL, gateway_settings, setup_or_skip

pytestmark = pytest.mark.e2e

SYSTEM = "In-process engines answer from the gateway's own process. " * 12


@pytest.fixture(scope="module")
def mixed_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    setup = setup_or_skip()
    spec = LaunchSpec(model=MODEL, max_model_len=2048, core=0)
    with running_replicas([spec], log_dir=tmp_path_factory.mktemp("vllm")) as (remote,):
        settings = gateway_settings([remote], setup)
        settings["replicas"].append({
            "id": "inproc", "kind": "inprocess", "model": MODEL,
            "vllm": {"model": str(setup.model_path(MODEL)), "load_format": "dummy",
                     "block_size": 32, "max_model_len": 2048, "enforce_eager": True}})
        gw = GatewayProcess(settings, python=str(setup.python), env={
            "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "1",
            "VLLM_HOST_IP": "127.0.0.1", "VLLM_NO_USAGE_STATS": "1"})
        started = time.monotonic()
        try:
            gw.start(timeout=300)
            print(f"\ngateway with an in-process engine ready in {time.monotonic() - started:.1f}s")
            yield gw
        finally:
            gw.stop()


def test_inprocess_replica_serves_like_a_remote_one(mixed_gateway: GatewayProcess) -> None:
    replicas = {r["id"]: r for r in
                httpx.get(mixed_gateway.url + "/admin/replicas").json()["replicas"]}
    assert replicas["inproc"]["healthy"] and replicas["inproc"]["kind"] == "inprocess"
    assert replicas["r0"]["healthy"]

    c = openai.OpenAI(base_url=mixed_gateway.url + "/v1", api_key="x", max_retries=0,
                      timeout=120)
    served: dict[str, list] = {}
    # Eight distinct prefixes, each sent twice: the first pass spreads the new
    # prefixes over both replicas, the second finds each one cached.
    for _ in range(2):
        for i in range(8):
            messages: list[ChatCompletionMessageParam] = [
                {"role": "system", "content": f"Tenant {i}. " + SYSTEM},
                {"role": "user", "content": "hello"}]
            raw = c.chat.completions.with_raw_response.create(model=MODEL, messages=messages,
                                                               max_tokens=3)
            served.setdefault(raw.headers["x-prefixgate-replica"], []).append(raw.parse())
    assert set(served) == {"inproc", "r0"}, {k: len(v) for k, v in served.items()}
    inproc = served["inproc"]
    assert all(r.object == "chat.completion" and r.choices[0].finish_reason == "length"
               for r in inproc)
    assert max(r.usage.prompt_tokens_details.cached_tokens for r in inproc) >= 128

    stream = c.chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": "Tenant 0. " + SYSTEM},
                               {"role": "user", "content": "stream please"}],
        max_tokens=5, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    done = c.completions.create(model=MODEL, prompt=SYSTEM, max_tokens=3)
    assert done.usage is not None and done.usage.completion_tokens == 3

    after = {r["id"]: r for r in
             httpx.get(mixed_gateway.url + "/admin/replicas").json()["replicas"]}
    # The precise index learns from the in-process engine's KV events too.
    assert (after["inproc"]["indexed_blocks"] or 0) > 0
    # The replica's own prefix-cache counter, as the gateway last scraped it (every
    # health_interval): it shows the hits within a few probes.
    series = 'prefixgate_replica_prefix_cache_hits_tokens_total{replica="inproc"}'
    deadline = time.monotonic() + 30
    while True:
        metrics = httpx.get(mixed_gateway.url + "/metrics").text
        assert series in metrics
        hits = float(next(line for line in metrics.splitlines()
                          if line.startswith(series)).split()[-1])
        if hits > 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert hits > 0
