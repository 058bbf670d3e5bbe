"""A lean streaming chat and completions client for benchmarks (aiohttp, no models).

The official ``openai`` client builds a pydantic object per streamed chunk;
on a 2-core machine that makes the load generator the bottleneck long before
a gateway is (about 25 ms of CPU per 64-token stream, measured). This client
sends the same request body the official client sends for
``chat.completions.create(stream=True, stream_options={"include_usage":
True})`` and reads the SSE lines itself: a line is decoded only until the
first content text is seen and for the final usage chunk, so timing and
token counts mean the same as in :mod:`.client` at a fraction of the CPU. A
call with a ``prompt`` goes to ``/v1/completions`` (text in ``choices[0].text``).
It is a measuring instrument, not a way to talk to prefixgate: every test
that checks the gateway uses the official client.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson

from .client import REPLICA_HEADER, ChatCall, ChatOutcome, measured


class RawChatClient:
    def __init__(self, base_url: str, api_key: str, timeout: float) -> None:
        self.url = base_url.rstrip("/") + "/v1/chat/completions"
        self.completions_url = base_url.rstrip("/") + "/v1/completions"
        self.headers = {"authorization": f"Bearer {api_key}",
                        "content-type": "application/json"}
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), timeout=self.timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def stream_chat(self, model: str, call: ChatCall, clock: Callable[[], float],
                          run_start: float) -> ChatOutcome:
        body: dict[str, Any] = {**call.body(model), "max_tokens": call.max_tokens,
                                "stream": True, "stream_options": {"include_usage": True}}
        url = self.completions_url if call.completions else self.url
        if call.ignore_eos:
            body["ignore_eos"] = True
        payload = orjson.dumps(body)
        # A fresh id per request: a gateway forwards it, so the simulated
        # replica's timing log (GET /sim/timings) can be joined to this record.
        request_id = uuid.uuid4().hex
        headers = {**self.headers, "x-request-id": request_id}
        start = clock()
        first: float | None = None
        pieces: list[str] = []
        chunks = 0
        usage: dict[str, Any] | None = None
        replica = error = None
        try:
            async with self._client().post(url, data=payload, headers=headers) as resp:
                replica = resp.headers.get(REPLICA_HEADER)
                if resp.status != 200:
                    error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                else:
                    async for line in resp.content:
                        if not line.startswith(b"data: {"):
                            continue
                        if first is None or b'"usage":{' in line:
                            chunk = orjson.loads(line[6:])
                            text = _text(chunk)
                            if text:
                                first = first if first is not None else clock()
                                pieces.append(text)
                            usage = chunk.get("usage") or usage
                        chunks += 1
        except Exception as exc:  # noqa: BLE001 - every failure is a measured outcome
            error = f"{type(exc).__name__}: {str(exc)[:200]}"
        end = clock()
        usage = usage or {}
        completion = usage.get("completion_tokens")
        details = usage.get("prompt_tokens_details") or {}
        record = measured(call, run_start, start, first, end, error, replica,
                          completion if completion is not None else chunks,
                          usage.get("prompt_tokens"), details.get("cached_tokens"), bool(usage),
                          request_id)
        # Only the first text piece is kept: a multi-turn workload, whose next
        # prompt holds the whole answer, must use the official client.
        return ChatOutcome(record, "".join(pieces))


def _text(chunk: dict[str, Any]) -> str:
    choices = chunk.get("choices") or ()
    if not choices:
        return ""
    if "text" in choices[0]:  # a completions chunk
        return choices[0].get("text") or ""
    delta = choices[0].get("delta") or {}
    return delta.get("content") or ""
