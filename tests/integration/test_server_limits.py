"""The HTTP server's bounds hold whatever the packet boundaries (``gateway.server.http``).

A real gateway process in front of a sim replica, spoken to over raw sockets:
the request head is sent in one write or in pieces, and what comes back is
what a client sees (status line, OpenAI-shaped error, the connection closed).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from gateway.server.http import MAX_HEADER_BYTES
from gateway.server.request_ids import MAX_REQUEST_ID
from tests.support.gateway import GatewayProcess
from tests.support.ports import free_port
from tests.support.waiting import wait_until

from .conftest import MODEL, gateway_settings, running_sims, sim_args

GUARD = 30.0
"""Seconds a socket read may block: a hang guard, far above any deadline here."""


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayProcess]:
    with running_sims([sim_args(0)]) as sims:
        gw = GatewayProcess(gateway_settings(sims, access_log=True))
        try:
            yield gw.start()
        finally:
            gw.stop()


def connect(gw: GatewayProcess) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", gw.port))
    sock.settimeout(GUARD)
    return sock


def answer_of(sock: socket.socket) -> bytes:
    """Everything the server sent until it closed the connection."""
    data = b""
    with sock:
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except ConnectionResetError:  # closed with our unread bytes still queued
            pass
    return data


def status_and_error(answer: bytes) -> tuple[int, dict]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, orjson.loads(body)["error"] if status >= 400 else {}


def head_with(extra: bytes, path: bytes = b"/health") -> bytes:
    return (b"GET " + path + b" HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n" + extra
            + b"\r\n")


def many_headers(total: int) -> bytes:
    line = b"X-Filler-%05d: " + b"v" * 40 + b"\r\n"
    return b"".join(line % i for i in range(total // len(line % 0) + 1))


HEADS = {
    "many headers": head_with(many_headers(100_000)),
    "one long header": head_with(b"X-Big: " + b"b" * 150_000 + b"\r\n"),
    "a long request line": head_with(b"", path=b"/health?q=" + b"q" * 120_000),
    "200 KB of headers": head_with(many_headers(200_000)),
}


@pytest.mark.parametrize("shape", HEADS)
def test_headers_over_the_limit_sent_in_one_write_get_a_431(gateway, shape) -> None:
    sock = connect(gateway)
    sock.sendall(HEADS[shape])
    status, error = status_and_error(answer_of(sock))
    assert status == 431
    assert str(MAX_HEADER_BYTES) in error["message"] and error["type"]


@pytest.mark.parametrize("piece", [1_000, 16_000])
def test_headers_over_the_limit_sent_in_pieces_get_a_431(gateway, piece) -> None:
    head = HEADS["many headers"]
    sock = connect(gateway)
    sent = 0
    try:
        while sent < len(head):
            sock.sendall(head[sent:sent + piece])
            sent += piece
            time.sleep(0.001)  # the slow client itself: the pieces arrive as separate reads
    except (BrokenPipeError, ConnectionResetError):
        pass  # refused before the rest was sent
    status, _ = status_and_error(answer_of(sock))
    assert status == 431


def test_a_long_header_sent_in_pieces_gets_a_431(gateway) -> None:
    sock = connect(gateway)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: gw\r\nX-Big: ")
    try:
        for _ in range(100):
            sock.sendall(b"b" * 1_000)
            time.sleep(0.001)
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert status_and_error(answer_of(sock))[0] == 431


def test_headers_under_the_limit_in_one_write_are_served(gateway) -> None:
    sock = connect(gateway)
    sock.sendall(head_with(many_headers(MAX_HEADER_BYTES - 2_000)))
    assert status_and_error(answer_of(sock))[0] == 200


# --- the probe port ----------------------------------------------------------------

LIMIT = 4


@pytest.fixture(scope="module")
def probed_gateway() -> Iterator[tuple[GatewayProcess, int]]:
    probe_port = free_port()
    with running_sims([sim_args(0)]) as sims:
        gw = GatewayProcess(gateway_settings(sims, health_port=probe_port, server={
            "max_connections": LIMIT, "header_timeout": GUARD}))
        try:
            yield gw.start(), probe_port
        finally:
            gw.stop()


def get(port: int, path: str) -> tuple[int, dict]:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(GUARD)
    sock.sendall(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
    return status_and_error(answer_of(sock))


def test_with_every_connection_held_by_slow_clients_the_probe_port_still_answers(
        probed_gateway) -> None:
    gw, probe_port = probed_gateway
    held = [connect(gw) for _ in range(LIMIT)]
    for sock in held:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: gw\r\n")  # headers never finished
    try:
        status, error = get(gw.port, "/health")
        assert (status, error["code"]) == (503, "too_many_connections")  # the client port
        assert get(probe_port, "/health")[0] == 200
        assert get(probe_port, "/ready")[0] == 200
    finally:
        for sock in held:
            sock.close()


def test_the_probe_port_serves_nothing_but_the_probes(probed_gateway) -> None:
    _, probe_port = probed_gateway
    status, error = get(probe_port, "/v1/models")
    assert status == 404 and "/health" in error["message"]


# --- what a request brings besides its body ------------------------------------------


def exchange(gw: GatewayProcess, request: bytes) -> tuple[bytes, bytes]:
    """The head and body the gateway answered ``request`` with, over a raw socket."""
    sock = connect(gw)
    sock.sendall(request)
    head, _, body = answer_of(sock).partition(b"\r\n\r\n")
    return head, body


def test_a_websocket_upgrade_gets_an_openai_shaped_400(gateway) -> None:
    head, body = exchange(gateway, b"GET /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
                                   b"Connection: Upgrade\r\nUpgrade: websocket\r\n"
                                   b"Sec-WebSocket-Version: 13\r\n"
                                   b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400")
    error = orjson.loads(body)["error"]
    assert error["code"] == "websocket_not_supported" and "WebSocket" in error["message"]
    assert error["type"] and "param" in error


HOSTILE_ID = ("line\u2028sep\u2029para\u0085next\u009b[2J" + "x" * 10_000).encode()


def test_a_hostile_request_id_is_logged_forwarded_and_echoed_escaped_and_capped(
        gateway) -> None:
    body = orjson.dumps({"model": MODEL, "max_tokens": 2,
                         "messages": [{"role": "user", "content": "hi"}]})
    head, _ = exchange(gateway, b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
                                b"Connection: close\r\nContent-Type: application/json\r\n"
                                b"X-Request-Id: " + HOSTILE_ID + b"\r\n"
                                b"Content-Length: %d\r\n\r\n" % len(body) + body)
    assert head.startswith(b"HTTP/1.1 200")
    echoed = next(line.split(b":", 1)[1].strip() for line in head.split(b"\r\n")
                  if line.lower().startswith(b"x-request-id:"))
    assert echoed.startswith(b"line%E2%80%A8sep%E2%80%A9para%C2%85next%C2%9B[2Jxxx")
    assert len(echoed) <= MAX_REQUEST_ID and all(0x21 <= b <= 0x7E for b in echoed)
    wait_until(lambda: echoed.decode() in gateway.log(), GUARD, "the access log line")
    line = next(line for line in gateway.log().splitlines() if echoed.decode() in line)
    assert orjson.loads(line[line.index("{"):])["request_id"] == echoed.decode()
    log = Path(gateway.log_path).read_bytes()
    for raw in ("\u2028", "\u2029", "\u0085", "\u009b"):
        assert raw.encode() not in log
