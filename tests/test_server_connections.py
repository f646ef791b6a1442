"""Connections that send no request (app/server/connections.py), on the real server (uvicorn on a loopback
port) in front of a fake engine: a client that drips its headers loses its connection after the header
deadline while one that sends them in time is answered, and connections that never send a request cannot
lock a new client out however many there are, while a request being answered keeps its connection."""
from __future__ import annotations

import http.client
import json
import socket
import time

import pytest

from app.server.schema import Defaults
from backend.sampling import GREEDY
from tests.test_server_hardening import CHAT, FakeGateway

DEADLINE_S = 1.0


@pytest.fixture
def served(request):
    from app.server.runner import LocalServer

    srv = LocalServer(FakeGateway(request.param), defaults=Defaults("off", sampling=GREEDY), port=0, max_queue=1,
                      header_deadline_s=DEADLINE_S).start()
    yield srv
    srv.stop()


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def closed_by_server(s: socket.socket, within_s: float) -> bool:
    """True once the server has closed `s` (a read gives EOF or a reset), waiting at most `within_s`."""
    s.settimeout(within_s)
    try:
        return s.recv(1024) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def health(port: int) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/health")
        r = conn.getresponse()
        data = r.read()
        return r.status, json.loads(data) if r.status == 200 else {"body": data}
    finally:
        conn.close()


@pytest.mark.parametrize("served", ["answer"], indirect=True)
def test_a_client_that_drips_its_headers_loses_its_connection_and_a_prompt_one_is_answered(served):
    drip = connect(served.port)
    t0 = time.monotonic()
    for byte in b"GET /health HTTP/1.1\r\nX-Slow: " + b"a" * 100:  # a byte every 0.1 s: 10 s of headers
        try:
            drip.sendall(bytes([byte]))
        except OSError:  # closed by the server
            break
        time.sleep(0.1)
    assert closed_by_server(drip, within_s=5), "a connection that sent no whole request in 10 s is still open"
    assert time.monotonic() - t0 < DEADLINE_S + 3
    drip.close()
    prompt = connect(served.port)  # the whole headers in two parts, within the deadline
    prompt.sendall(b"GET /health HTTP/1.1\r\n")
    time.sleep(DEADLINE_S / 10)  # two parts, far inside the deadline on a loaded machine
    prompt.sendall(f"Host: 127.0.0.1:{served.port}\r\n\r\n".encode())
    prompt.settimeout(10)
    assert prompt.recv(1024).startswith(b"HTTP/1.1 200")
    prompt.close()
    status, h = health(served.port)
    assert status == 200 and h["stats"]["closed_no_request"] == 1, h


@pytest.mark.parametrize("served", ["hang"], indirect=True)
def test_connections_that_never_send_a_request_cannot_lock_a_new_client_out(served):
    answering = connect(served.port)  # a chat request the engine never answers: it is in progress throughout
    body = json.dumps(CHAT).encode()
    answering.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{served.port}\r\nContent-Type: "
                      f"application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    deadline = time.monotonic() + 10
    while health(served.port)[1]["in_flight"] != 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    limit = served._server.config.limit_concurrency
    silent = [connect(served.port) for _ in range(limit)]  # as many as uvicorn lets in: none sends a byte
    try:
        time.sleep(0.2)
        status, h = health(served.port)  # before the deadline frees any of them
        assert status == 200, "a new client was locked out by connections that never sent a request"
        assert h["stats"]["closed_for_room"] >= 2 and "closed_no_request" not in h["stats"], h
        assert closed_by_server(silent[0], within_s=1)  # the one that waited longest went first
        assert not closed_by_server(answering, within_s=0.5), "a request in progress lost its connection"
    finally:
        for s in silent + [answering]:
            s.close()
