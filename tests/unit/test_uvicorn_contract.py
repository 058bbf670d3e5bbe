"""What ``gateway.server.http`` relies on in uvicorn's private parts, checked against the
uvicorn installed: a failure names that uvicorn's version and what changed.

``GuardedHttpTools`` subclasses uvicorn's private ``HttpToolsProtocol``: it overrides
the methods of ``OVERRIDDEN`` (their parameters as uvicorn defines them), reads the
attributes of ``PROTOCOL_ATTRIBUTES`` and ``CYCLE_ATTRIBUTES`` (``CycleBodyWriter``
writes a stream's chunks on the cycle's transport, framed as its ``send`` would), and
counts on uvicorn's ``data_received`` sending a parser error to ``send_400_response``
and a WebSocket upgrade to ``_should_upgrade_to_ws`` and ``handle_websocket_upgrade``.
``GatewayServer`` overrides ``uvicorn.Server.startup`` and ``handle_exit``. pyproject.toml
pins uvicorn to the versions this was tested with; a uvicorn outside them, or a change
in one inside them, fails here before a slow client finds out.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import signal
import tomllib
from pathlib import Path
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from gateway.config import ServerSettings, load_settings
from gateway.request.drain import Drain
from gateway.server.http import GatewayServer, GuardedHttpTools, protocol_class, server_config

ROOT = Path(__file__).resolve().parents[2]

OVERRIDDEN: dict[str, tuple[str, ...]] = {
    "connection_made": ("transport",),
    "connection_lost": ("exc",),
    "data_received": ("data",),
    "on_message_begin": (),
    "on_url": ("url",),
    "on_header": ("name", "value"),
    "on_headers_complete": (),
    "on_message_complete": (),
    "_should_upgrade_to_ws": (),
    "handle_websocket_upgrade": (),
    "_unsupported_upgrade_warning": (),
    "send_400_response": ("msg",),
}
"""HttpToolsProtocol's methods GuardedHttpTools overrides, and their parameters."""
PROTOCOL_ATTRIBUTES = ("app", "loop", "limit_concurrency", "connections", "tasks", "transport",
                       "server", "cycle")
CYCLE_ATTRIBUTES = ("response_started", "response_complete", "disconnected", "message_event",
                    "chunked_encoding", "flow", "transport", "scope")
"""What GuardedHttpTools and its ``CycleBodyWriter`` (a stream's chunks written by a plain
call, framed as the cycle's ``send`` frames them) read of a cycle."""
SERVER_METHODS: dict[str, tuple[str, ...]] = {"startup": ("sockets",),
                                              "handle_exit": ("sig", "frame")}
CONFIG_PARAMETERS = ("http", "ws", "loop", "timeout_keep_alive", "limit_concurrency",
                     "timeout_graceful_shutdown", "access_log", "log_level")


def _pin() -> str:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    [pin] = [d for d in project["dependencies"] if re.match(r"uvicorn\b", d)]
    return str(pin)


def _changed(what: str) -> str:
    return (f"uvicorn {uvicorn.__version__}: {what}. gateway/server/http.py relies on it "
            f"(its slow-client bounds subclass uvicorn's private HttpToolsProtocol); it is "
            f"tested with {_pin()} (pyproject.toml): adapt it, then widen the pin")


def _parameters(function: Any) -> tuple[str, ...]:
    return tuple(name for name in inspect.signature(function).parameters if name != "self")


def test_uvicorn_is_pinned_to_a_tested_range() -> None:
    assert re.fullmatch(r"uvicorn\[standard\]>=[\d.]+,<[\d.]+", _pin()), (
        f"pin uvicorn to the versions gateway/server/http.py is tested with, not {_pin()}")


def test_the_overridden_methods_exist_with_their_parameters() -> None:
    for name, expected in OVERRIDDEN.items():
        base = getattr(HttpToolsProtocol, name, None)
        assert base is not None, _changed(f"HttpToolsProtocol.{name} is gone")
        found = _parameters(base)
        assert found == expected, _changed(
            f"HttpToolsProtocol.{name} takes ({', '.join(found)}), not ({', '.join(expected)})")
        assert _parameters(getattr(GuardedHttpTools, name)) == expected, name
    ours = {name for name, value in vars(GuardedHttpTools).items()
            if callable(value) and hasattr(HttpToolsProtocol, name)}
    assert ours == set(OVERRIDDEN), "a new override: add it to OVERRIDDEN"
    for name, expected in SERVER_METHODS.items():
        found = _parameters(getattr(uvicorn.Server, name))
        assert found == expected, _changed(f"Server.{name} takes ({', '.join(found)})")
    config = inspect.signature(uvicorn.Config).parameters
    missing = [name for name in CONFIG_PARAMETERS if name not in config]
    assert not missing, _changed(f"uvicorn.Config takes no {', '.join(missing)}")


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(
            name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _ok(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _connected(app: Any = _ok) -> tuple[GuardedHttpTools, _Transport]:
    config = uvicorn.Config(app, http=protocol_class(ServerSettings()), ws="none",
                            log_level="warning")
    config.load()
    protocol = protocol_class(ServerSettings())(config, ServerState(), {},
                                                _loop=asyncio.get_running_loop())
    transport = _Transport()
    protocol.connection_made(transport)
    return protocol, transport


async def test_a_request_runs_through_the_attributes_the_bounds_read() -> None:
    protocol, transport = _connected()
    missing = [name for name in PROTOCOL_ATTRIBUTES if not hasattr(protocol, name)]
    assert not missing, _changed(f"HttpToolsProtocol has no {', '.join(missing)}")
    assert protocol.server == ("127.0.0.1", 8000), _changed("HttpToolsProtocol.server changed")
    protocol.data_received(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
    assert isinstance(protocol.cycle, RequestResponseCycle), _changed("no cycle per request")
    missing = [name for name in CYCLE_ATTRIBUTES if not hasattr(protocol.cycle, name)]
    assert not missing, _changed(f"RequestResponseCycle has no {', '.join(missing)}")
    for _ in range(100):
        if protocol.cycle.response_complete:
            break
        await asyncio.sleep(0.01)
    assert transport.written.startswith(b"HTTP/1.1 200"), transport.written
    assert protocol._deadline is None  # answered: no deadline while the connection idles
    protocol.data_received(b"GET /hea")  # the next request's first bytes: headers deadline
    assert protocol._deadline is not None and protocol._deadline_kind == "headers", _changed(
        "RequestResponseCycle.response_complete no longer tells an answered request")
    protocol.connection_lost(None)


async def test_a_parser_error_reaches_send_400_response() -> None:
    protocol, transport = _connected()
    protocol.data_received(b"NOT HTTP AT ALL\r\n\r\n")
    assert transport.written.startswith(b"HTTP/1.1 400") and b"malformed HTTP" in \
        transport.written, _changed("a parser error no longer reaches send_400_response")
    assert transport.closed


async def test_a_websocket_upgrade_reaches_handle_websocket_upgrade() -> None:
    protocol, transport = _connected()
    protocol.data_received(b"GET /v1/realtime HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\n"
                           b"upgrade: websocket\r\nsec-websocket-version: 13\r\n"
                           b"sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
    assert b"websocket_not_supported" in transport.written, _changed(
        "a WebSocket upgrade no longer goes through _should_upgrade_to_ws and "
        "handle_websocket_upgrade")


async def test_the_server_subclass_builds() -> None:
    settings = load_settings(overrides={"replicas": [{"url": "http://127.0.0.1:1"}]}, env={})
    server = GatewayServer(server_config(_ok, settings), Drain(0.0))
    assert server.should_exit is False, _changed("Server.should_exit is gone")
    server.handle_exit(signal.SIGTERM, None)  # not serving yet: uvicorn's own exit
    assert server.should_exit is True
