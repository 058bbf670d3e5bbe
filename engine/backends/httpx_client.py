"""A backend over an httpx transport: in-process engines and faked replicas.

The in-process engine plugs its ASGI transport in here; unit tests plug
``httpx.MockTransport``. Remote replicas use the faster ``engine.backends.remote``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

import httpx

from engine.backends.base import Timeouts, UpstreamResponse, outgoing_headers
from engine.errors import (
    ReplicaStreamBroken,
    ReplicaTimeout,
    ReplicaUnavailable,
    ReplicaUnreachable,
)


class HttpxBackend:
    def __init__(
        self,
        replica_id: str,
        base_url: str,
        timeouts: Timeouts,
        transport: httpx.AsyncBaseTransport | None = None,
        max_connections: int = 1000,
        api_key: str | None = None,
    ) -> None:
        self.replica_id = replica_id
        self.base_url = base_url.rstrip("/")
        self.timeouts = timeouts
        self._auth = {"authorization": f"Bearer {api_key}"} if api_key else {}
        limits = httpx.Limits(max_connections=max_connections,
                              max_keepalive_connections=max_connections)
        # Read timeouts are enforced per phase below (first byte vs idle), so the
        # client-level read timeout is off.
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(connect=timeouts.connect, read=None, write=30.0, pool=30.0),
            limits=limits,
            transport=transport,
        )

    async def send(self, path: str, body: bytes, headers: Mapping[str, str],
                   method: str = "POST") -> UpstreamResponse:
        out_headers = outgoing_headers(headers, self._auth)
        request = self._client.build_request(method, path, content=body, headers=out_headers)
        try:
            async with asyncio.timeout(self.timeouts.response):
                response = await self._client.send(request, stream=True)
        except TimeoutError:
            raise ReplicaTimeout(self.replica_id,
                                     "no status line before the response timeout") from None
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise ReplicaUnreachable(self.replica_id, f"{type(exc).__name__}: {exc}") from None
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError,
                httpx.PoolTimeout) as exc:
            raise ReplicaUnavailable(self.replica_id, f"{type(exc).__name__}: {exc}") from None
        return UpstreamResponse(
            status_code=response.status_code,
            headers=dict(response.headers),
            chunks=self._chunks(response),
            close=response.aclose,
        )

    async def _chunks(self, response: httpx.Response) -> AsyncIterator[bytes]:
        iterator = response.aiter_bytes().__aiter__()
        # The first chunk (a stream's first token) may take as long as a response may;
        # the proxy's first-byte deadline judges that wait. Then ``idle`` between chunks.
        limit = self.timeouts.response
        while True:
            try:
                async with asyncio.timeout(limit):
                    chunk = await iterator.__anext__()
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise ReplicaTimeout(self.replica_id, "stream idle for too long") from None
            except httpx.HTTPError as exc:
                raise ReplicaStreamBroken(self.replica_id, f"{type(exc).__name__}: {exc}") from None
            if chunk:
                limit = self.timeouts.idle
                yield chunk

    async def get(self, path: str) -> tuple[int, bytes]:
        try:
            response = await self._client.get(path, timeout=self.timeouts.probe, headers=self._auth)
        except httpx.HTTPError as exc:
            raise ReplicaUnavailable(self.replica_id, f"{type(exc).__name__}: {exc}") from None
        return response.status_code, response.content

    async def aclose(self) -> None:
        await self._client.aclose()
