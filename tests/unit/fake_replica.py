"""A fake vLLM replica as a plain function, for ``httpx.MockTransport``.

Only for unit tests of the gateway's own logic (routing, errors, failover,
accounting); everything a user relies on is tested against real servers.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx

from engine.backends.base import Timeouts
from engine.backends.httpx_client import HttpxBackend
from engine.pool.replicas import ReplicaPool, ReplicaSpec


@dataclass
class FakeReplica:
    name: str
    model: str = "m"
    up: bool = True
    running: int = 0
    chunks: int = 3
    break_stream_after: int | None = None
    status: int = 200
    publishes_capacity: bool = True
    """Whether its metrics carry ``vllm:cache_config_info`` (block size, capacity, dtype)."""
    aliases: tuple[str, ...] = ()
    """More served names of the same model (``--served-model-name m a b``)."""
    adapters: tuple[str, ...] = ()
    """LoRA adapters it serves, listed as vLLM lists them (``parent``: the model)."""
    api_key: str | None = None
    """The key its /v1 routes take, as vLLM's ``--api-key`` (401 without it)."""
    requests: list[dict] = field(default_factory=list)
    headers_seen: list[dict] = field(default_factory=list)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if not self.up:
            raise httpx.ConnectError("connection refused", request=request)
        path = request.url.path
        if self.api_key and path.startswith("/v1") \
                and request.headers.get("authorization") != f"Bearer {self.api_key}":
            return httpx.Response(401, json={"error": "Unauthorized"})
        if path == "/health":
            return httpx.Response(200)
        if path == "/metrics":
            text = (f'vllm:num_requests_running{{engine="0",model_name="{self.model}"}} '
                    f'{self.running}.0\n')
            if self.publishes_capacity:
                text += ('vllm:cache_config_info{block_size="32",cache_dtype="fp8",'
                         'num_gpu_blocks="1000"} 1.0\n')
            return httpx.Response(200, text=text)
        if path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [
                *({"id": name, "root": "/models/" + self.model, "parent": None}
                  for name in (self.model, *self.aliases)),
                *({"id": name, "root": "/adapters/" + name, "parent": self.model}
                  for name in self.adapters)]})
        body = json.loads(request.content)
        self.requests.append(body)
        self.headers_seen.append(dict(request.headers))
        if self.status != 200:
            return httpx.Response(self.status, json={"error": {"message": "replica says no",
                                                               "type": "BadRequestError",
                                                               "param": None, "code": self.status}})
        if body.get("stream"):
            return httpx.Response(200, headers={"content-type": "text/event-stream"},
                                  stream=_Stream(self))
        return httpx.Response(200, json={
            "id": "chatcmpl-1", "object": "chat.completion", "model": self.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": self.name},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8,
                      "prompt_tokens_details": {"cached_tokens": 4}}})


class _Stream(httpx.AsyncByteStream):
    def __init__(self, replica: FakeReplica) -> None:
        self.replica = replica

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for i in range(self.replica.chunks):
            if self.replica.break_stream_after is not None and i >= self.replica.break_stream_after:
                raise httpx.ReadError("connection reset")
            chunk = {"id": "c", "object": "chat.completion.chunk",
                     "choices": [{"index": 0, "delta": {"content": f"t{i}"}}]}
            yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"


async def fake_pool(*names: str) -> ReplicaPool:
    """A started pool of fake replicas serving model ``m`` (no health probes)."""
    replicas = [(ReplicaSpec(name, f"http://{name}", model="m"),
                 HttpxBackend(name, f"http://{name}", Timeouts(),
                              transport=FakeReplica(name).transport()))
                for name in names]
    pool = ReplicaPool(replicas, health_interval=3600)
    await pool.start()
    return pool
