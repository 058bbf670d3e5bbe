"""Remote backend: a vLLM OpenAI server over HTTP with aiohttp.

One ``aiohttp.ClientSession`` per replica with a keep-alive pool. aiohttp
parses HTTP in C and its pool does not rescan every connection per request,
which matters at hundreds of concurrent streams (httpx/httpcore spent most of
the gateway's CPU in pool bookkeeping and pure-Python chunk parsing; see
BENCHMARKS.md). Timeouts are enforced per phase: connect, first byte (the
status line, which for a non-streaming answer comes when it is complete),
and idle time between two body chunks.

Keep-alive connections are dropped after 2 s idle — less than vLLM's
(uvicorn's) 5 s — so the gateway does not write into a connection the server
is closing. If that race still happens (the server closes a reused
connection before answering), the request is sent once more on a fresh
connection — never another pooled one, which the server may have closed
as well: the replica never saw it. A connect timeout is a failure to
connect (``ReplicaUnavailable``), not a replica slow to answer. aiohttp's
exceptions are translated here into ``engine.errors`` types.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

import aiohttp

from engine.backends.base import Timeouts, UpstreamResponse, outgoing_headers
from engine.errors import (
    ReplicaStreamBroken,
    ReplicaTimeout,
    ReplicaUnavailable,
    ReplicaUnreachable,
)

_READ_CHUNK = 65536


def _unreached(replica_id: str, attempt: int, message: str) -> ReplicaUnavailable:
    """A connection that could not be made. On the first attempt the request never
    arrived; on the second, the first attempt's connection was dropped after the
    request went out on it, so it may have arrived (and been what took the replica down)."""
    if attempt == 1:
        return ReplicaUnreachable(replica_id, message)
    return ReplicaUnavailable(replica_id, f"the connection dropped, then {message}")


class RemoteBackend:
    def __init__(self, replica_id: str, base_url: str, timeouts: Timeouts,
                 max_connections: int = 1000, api_key: str | None = None) -> None:
        self.replica_id = replica_id
        self.base_url = base_url.rstrip("/")
        self.timeouts = timeouts
        self.max_connections = max_connections
        self._auth = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._session: aiohttp.ClientSession | None = None
        self._fresh: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        # Created on first use: a session belongs to the running event loop.
        if self._session is None or self._session.closed:
            self._session = self._new_session(pooled=True)
        return self._session

    def _fresh_client(self) -> aiohttp.ClientSession:
        # For the resend: a session that never reuses a connection, so the
        # request cannot land on another pooled one the replica closed too.
        if self._fresh is None or self._fresh.closed:
            self._fresh = self._new_session(pooled=False)
        return self._fresh

    def _new_session(self, pooled: bool) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0,
                                         ttl_dns_cache=60, force_close=not pooled,
                                         keepalive_timeout=2.0 if pooled else None)
        return aiohttp.ClientSession(
            connector=connector, auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, connect=self.timeouts.connect,
                                          sock_connect=self.timeouts.connect))

    async def send(self, path: str, body: bytes, headers: Mapping[str, str],
                   method: str = "POST") -> UpstreamResponse:
        out = outgoing_headers(headers, self._auth)
        url = self.base_url + path
        for attempt in (1, 2):
            try:
                session = self._client() if attempt == 1 else self._fresh_client()
                async with asyncio.timeout(self.timeouts.response):
                    response = await session.request(method, url, data=body or None, headers=out)
                break
            except aiohttp.ConnectionTimeoutError:  # a TimeoutError too, but nothing was sent
                raise _unreached(self.replica_id, attempt, "cannot connect: timed out") from None
            except TimeoutError:
                raise ReplicaTimeout(self.replica_id,
                                     "no status line before the response timeout") from None
            except aiohttp.ClientConnectorError as exc:
                raise _unreached(self.replica_id, attempt, f"cannot connect: {exc}") from None
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                if attempt == 2:  # a fresh connection failed too: the replica is in trouble
                    raise ReplicaUnavailable(self.replica_id,
                                             f"{type(exc).__name__}: {exc}") from None
            except aiohttp.ClientError as exc:
                raise ReplicaUnavailable(self.replica_id, f"{type(exc).__name__}: {exc}") from None
        return UpstreamResponse(
            status_code=response.status,
            headers={k.lower(): v for k, v in response.headers.items()},
            chunks=self._chunks(response),
            close=self._closer(response),
        )

    async def _chunks(self, response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
        content = response.content
        loop = asyncio.get_running_loop()
        idle = self.timeouts.idle
        # The idle timeout is a lazy timer: a read only notes when it started
        # waiting, and a timer that fires at most once per ``idle`` seconds
        # checks that note — instead of arming and cancelling a timer per
        # chunk (asyncio.timeout), which at thousands of chunks a second was a
        # good part of the gateway's CPU. A read waiting too long is failed by
        # setting the exception on aiohttp's stream reader.
        # The first chunk may take as long as a response may (``response``): for a
        # stream it is the first token, and a queued request's first token waits for
        # the queue; the proxy's first-byte deadline judges that wait.
        waiting_since = [0.0]
        limit = [self.timeouts.response]
        timer: asyncio.TimerHandle

        def check() -> None:
            nonlocal timer
            started = waiting_since[0]
            if started and loop.time() - started >= limit[0]:
                content.set_exception(ReplicaTimeout(
                    self.replica_id, "stream idle for too long"))
                return
            timer = loop.call_at((started or loop.time()) + min(limit[0], idle), check)

        timer = loop.call_at(loop.time() + min(limit[0], idle), check)
        try:
            while True:
                waiting_since[0] = loop.time()
                try:
                    chunk = await content.readany()
                except ReplicaTimeout:
                    raise
                except (aiohttp.ClientError, ConnectionError) as exc:
                    raise ReplicaStreamBroken(self.replica_id,
                                              f"{type(exc).__name__}: {exc}") from None
                waiting_since[0] = 0.0
                if not chunk:
                    if content.at_eof():
                        return
                    continue
                limit[0] = idle
                yield chunk
        finally:
            timer.cancel()

    @staticmethod
    def _closer(response: aiohttp.ClientResponse) -> Callable[[], Awaitable[None]]:
        async def close() -> None:
            # A body read to its end goes back to the pool; otherwise the
            # connection is closed, which tells vLLM to abort the request.
            if response.content.at_eof():
                response.release()
            else:
                response.close()
        return close

    async def get(self, path: str) -> tuple[int, bytes]:
        try:
            async with asyncio.timeout(self.timeouts.probe):
                async with self._client().get(self.base_url + path, headers=self._auth) as r:
                    return r.status, await r.read()
        except TimeoutError:
            raise ReplicaUnavailable(self.replica_id, f"GET {path} timed out") from None
        except aiohttp.ClientError as exc:
            raise ReplicaUnavailable(self.replica_id, f"{type(exc).__name__}: {exc}") from None

    async def aclose(self) -> None:
        for session in (self._session, self._fresh):
            if session is not None:
                await session.close()
