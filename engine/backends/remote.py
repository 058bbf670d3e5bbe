"""Remote backend: a vLLM OpenAI server over HTTP/1.1 (``engine.backends.h1``).

One pool of keep-alive connections per replica, on asyncio's protocol layer
with httptools parsing: a streamed answer can be poured straight into the
client's connection (``UpstreamResponse.pour``), so a relayed token costs no
task wake-up (aiohttp's client, used before, spent a future, a task step and
two async iterators on each; httpx/httpcore before that spent most of the
gateway's CPU in pool bookkeeping; see BENCHMARKS.md). Timeouts are enforced
per phase: connect, first byte (the status line, which for a non-streaming
answer comes when it is complete), and idle time between two body chunks.

Keep-alive connections are dropped after 2 s idle (``h1.KEEPALIVE``), less
than vLLM's (uvicorn's) 5 s, so the gateway does not write into a connection
the server is closing. If that race still happens (the server closes a
reused connection before answering), the request is sent once more on a
fresh connection, never another pooled one, which the server may have
closed as well: the replica never saw it. A connect timeout is a failure to
connect (``ReplicaUnavailable``), not a replica slow to answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from engine.backends.base import Timeouts, UpstreamResponse, outgoing_headers
from engine.backends.h1 import Body, Connection, Connections, Disconnected, Target
from engine.errors import EngineError, ReplicaTimeout, ReplicaUnavailable, ReplicaUnreachable


def _unreached(replica_id: str, attempt: int, message: str) -> ReplicaUnavailable:
    """A connection that could not be made. On the first attempt the request never
    arrived; on the second, the first attempt's connection was dropped after the
    request went out on it, so it may have arrived (and been what took the replica down)."""
    if attempt == 1:
        return ReplicaUnreachable(replica_id, message)
    return ReplicaUnavailable(replica_id, f"the connection dropped, then {message}")


class RemoteBackend:
    def __init__(self, replica_id: str, base_url: str, timeouts: Timeouts,
                 max_idle: int = 1000, api_key: str | None = None) -> None:
        """``max_idle``: the most kept-alive connections held for reuse. Connections in
        use are not capped here: the gateway's own connection limit bounds its requests."""
        self.replica_id = replica_id
        self.base_url = base_url.rstrip("/")
        self.timeouts = timeouts
        self._auth = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._pool = Connections(replica_id, Target(self.base_url), max_idle)

    async def send(self, path: str, body: bytes, headers: Mapping[str, str],
                   method: str = "POST") -> UpstreamResponse:
        data = self._pool.target.request(method, path, outgoing_headers(headers, self._auth),
                                         body)
        return await self._exchange(data, self.timeouts.response)

    async def _exchange(self, data: bytes, response_timeout: float) -> UpstreamResponse:
        for attempt in (1, 2):
            connection = self._pool.pooled() if attempt == 1 else None
            if connection is None:
                connection = await self._connect(attempt)
            connection.send(data)
            try:
                async with asyncio.timeout(response_timeout):
                    await connection.head
            except TimeoutError:
                connection.abort()  # how vLLM learns to abort the request
                raise ReplicaTimeout(self.replica_id,
                                     "no status line before the response timeout") from None
            except Disconnected as exc:
                connection.abort()
                if attempt == 2:  # a fresh connection failed too: the replica is in trouble
                    raise ReplicaUnavailable(self.replica_id, str(exc)) from None
                continue
            except BaseException:
                connection.abort()
                raise
            return self._response(connection)
        raise AssertionError("unreachable")

    async def _connect(self, attempt: int) -> Connection:
        try:
            return await self._pool.connect(self.timeouts.connect)
        except TimeoutError:
            raise _unreached(self.replica_id, attempt, "cannot connect: timed out") from None
        except OSError as exc:
            raise _unreached(self.replica_id, attempt, f"cannot connect: {exc}") from None

    def _response(self, connection: Connection) -> UpstreamResponse:
        body = Body(connection, self._pool, self.timeouts.response, self.timeouts.idle)
        return UpstreamResponse(status_code=connection.status, headers=connection.headers,
                                chunks=body, close=body.close, pour=body.pour)

    async def get(self, path: str) -> tuple[int, bytes]:
        try:
            async with asyncio.timeout(self.timeouts.probe):
                upstream = await self._exchange(
                    self._pool.target.request("GET", path, self._auth, b""), self.timeouts.probe)
                return upstream.status_code, await upstream.read()
        except TimeoutError:
            raise ReplicaUnavailable(self.replica_id, f"GET {path} timed out") from None
        except ReplicaUnavailable:
            raise
        except EngineError as exc:
            raise ReplicaUnavailable(self.replica_id, exc.detail) from None

    async def aclose(self) -> None:
        self._pool.close()
