"""What one ops sample holds the serving loop: all of the registry, or the series it reads.

    python -m loadtest.sampler_cost [--replicas 4,16] [--requests 200] [--repeat 200]

Every two seconds the ops sampler (``gateway.ops.sampler``) reads the
gateway's metrics registry on the serving loop, and a request arriving
meanwhile waits for it. This builds a real gateway in this process
(``create_app``) in front of ``--replicas`` in-memory replicas, sends it
``--requests`` chat requests (streaming and not, a few errors) so that its
series carry the label sets of real traffic, then times, interleaved, one
reading the way the sampler takes it now (``local_readings``: the series the
readings read, ``READ_SERIES``) and the way it took it before (a collection of
the whole registry, read the same way). Prints p50/p99 in milliseconds per
replica count as a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
from collections.abc import AsyncIterator, Callable

import httpx
import orjson
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry

from gateway.config import load_settings
from gateway.ops.load import read_load
from gateway.ops.stats import read_registry
from gateway.ops.worker_readings import Readings, local_readings
from gateway.server.app import create_app

MODEL = "m"


def _replica(name: str) -> httpx.MockTransport:
    """An in-memory replica: health, metrics, models, and a short answer."""
    def handle(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/health":
            return httpx.Response(200)
        if path == "/metrics":
            return httpx.Response(200, text=(
                f'vllm:num_requests_running{{model_name="{MODEL}"}} 1.0\n'
                'vllm:cache_config_info{block_size="16",num_gpu_blocks="1000"} 1.0\n'))
        if path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": MODEL}]})
        body = orjson.loads(request.content)
        usage = {"prompt_tokens": 40, "completion_tokens": 2, "total_tokens": 42,
                 "prompt_tokens_details": {"cached_tokens": 32}}
        if body.get("stream"):
            chunk = {"id": "c", "object": "chat.completion.chunk", "model": MODEL,
                     "choices": [{"index": 0, "delta": {"content": name}}]}
            tail = {**chunk, "choices": [], "usage": usage}
            text = f"data: {orjson.dumps(chunk).decode()}\n\n" * 2 \
                + f"data: {orjson.dumps(tail).decode()}\n\ndata: [DONE]\n\n"
            return httpx.Response(200, headers={"content-type": "text/event-stream"},
                                  content=text.encode())
        return httpx.Response(200, json={
            "id": "c", "object": "chat.completion", "model": MODEL,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": name},
                         "finish_reason": "stop"}], "usage": usage})
    return httpx.MockTransport(handle)


def full_readings(registry: CollectorRegistry, ids: list[str]) -> Readings:
    """The readings from a collection of the whole registry (what the sampler took)."""
    collected = list(registry.collect())
    return read_registry(collected, ids), read_load(collected)


def _timed(read: Callable[[], object], into: list[float]) -> None:
    start = time.perf_counter()
    read()
    into.append((time.perf_counter() - start) * 1e3)


@contextlib.asynccontextmanager
async def gateway_after_traffic(replicas: int,
                                requests: int) -> AsyncIterator[tuple[CollectorRegistry, list[str]]]:
    """A running gateway in this process in front of ``replicas`` in-memory replicas, after
    ``requests`` chat requests (every other one streamed, one in 20 for a model nobody
    serves): its metrics registry and the replicas' ids."""
    ids = [f"r{i}" for i in range(replicas)]
    transports = {rid: _replica(rid) for rid in ids}
    settings = load_settings(overrides={
        "replicas": [{"id": rid, "url": f"http://{rid}"} for rid in ids],
        "health_interval": 3600.0, "policy": "prefix"}, env={})
    app = create_app(settings, transport=lambda rid: transports[rid])
    async with LifespanManager(app) as manager, httpx.AsyncClient(
            transport=httpx.ASGITransport(app=manager.app), base_url="http://gw") as client:
        for index in range(requests):
            model = MODEL if index % 20 else "unknown"  # a few 404s: their label sets too
            await client.post("/v1/chat/completions", json={
                "model": model, "stream": index % 2 == 0, "max_tokens": 4,
                "messages": [{"role": "system", "content": f"You are app {index % 8}. " * 40},
                             {"role": "user", "content": f"question {index}"}]})
        yield app.gateway.metrics.registry, ids


async def measure(replicas: int, requests: int, repeat: int) -> dict[str, float]:
    narrowed: list[float] = []
    whole: list[float] = []
    async with gateway_after_traffic(replicas, requests) as (registry, ids):
        for _ in range(repeat):
            _timed(lambda: local_readings(registry, ids), narrowed)
            _timed(lambda: full_readings(registry, ids), whole)
    return {"narrowed_p50": statistics.median(narrowed),
            "narrowed_p99": sorted(narrowed)[int(0.99 * (len(narrowed) - 1))],
            "whole_p50": statistics.median(whole),
            "whole_p99": sorted(whole)[int(0.99 * (len(whole) - 1))]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", default="4,16")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args(argv)
    print("| replicas | whole registry p50 / p99 ms | the series read p50 / p99 ms | ratio p50 |")
    print("|---|---|---|---|")
    for count in (int(n) for n in args.replicas.split(",")):
        r = asyncio.run(measure(count, args.requests, args.repeat))
        print(f"| {count} | {r['whole_p50']:.3f} / {r['whole_p99']:.3f} | "
              f"{r['narrowed_p50']:.3f} / {r['narrowed_p99']:.3f} | "
              f"{r['narrowed_p50'] / r['whole_p50']:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
