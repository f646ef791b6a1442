"""The server's memory before admission (issue 55, item 7): a request's messages are capped, and request bodies
are read and parsed only within a bounded room (app/server/body.py's BodyRoom), on the real server (uvicorn on
a loopback port) in front of a fake engine. Without the room every connection read and parsed its body at once."""
from __future__ import annotations

import json
import socket
import threading
import time
import tracemalloc

import pytest

from app.server.schema import MAX_MESSAGES, Defaults
from backend.sampling import GREEDY
from tests.test_server_connections import health
from tests.test_server_hardening import client, FakeGateway


def test_more_messages_than_the_cap_get_400_that_says_the_cap():
    c = client()
    many = [{"role": "user", "content": "hi"}] * (MAX_MESSAGES + 1)
    r = c.post("/v1/chat/completions", json={"messages": many})
    error = r.json()["error"]
    assert r.status_code == 400 and error["code"] == "array_too_long" and error["param"] == "messages"
    assert f"{MAX_MESSAGES:,}" in error["message"] and f"{MAX_MESSAGES + 1:,}" in error["message"]
    parts = [{"type": "text", "text": "x"}] * (MAX_MESSAGES + 1)
    r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": parts}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content"
    r = c.post("/v1/chat/completions", json={"messages": many[:MAX_MESSAGES], "max_tokens": 2})
    assert r.status_code == 200


@pytest.fixture
def serve():
    from app.server.runner import LocalServer

    servers = []

    def start(**kw):
        servers.append(LocalServer(FakeGateway(), defaults=Defaults("off", sampling=GREEDY), port=0, **kw).start())
        return servers[-1]

    yield start
    for srv in servers:
        srv.stop()


def chat_body(size: int) -> bytes:
    """A chat request of exactly `size` bytes."""
    empty = json.dumps({"messages": [{"role": "user", "content": ""}], "max_tokens": 2})
    return json.dumps({"messages": [{"role": "user", "content": "a" * (size - len(empty))}], "max_tokens": 2}).encode()


def post(port: int, body: bytes, *, hold_last: bool = False) -> socket.socket:
    """A connection that has sent a chat request's headers and its body (all but its last byte if `hold_last`)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(body)}\r\n\r\n".encode() + (body[:-1] if hold_last else body))
    return s


def answer(s: socket.socket, within_s: float = 30) -> tuple[int, bytes] | None:
    """The status and the whole answer (head and body); None if nothing came in time."""
    s.settimeout(within_s)
    try:
        data = s.recv(65536)
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _length(data):
            more = s.recv(65536)
            if not more:
                break
            data += more
    except socket.timeout:
        return None
    return int(data.split(b" ")[1]), data


def _length(data: bytes) -> int:
    head = data.split(b"\r\n\r\n", 1)[0].lower()
    return int(head.split(b"content-length: ")[1].split(b"\r\n")[0]) if b"content-length: " in head else 0


def test_a_body_beyond_the_room_waits_its_turn_then_gets_503_with_retry_after(serve):
    srv = serve(body_room_bytes=1_000_000, body_wait_s=5.0)  # the /health below is asked well within it
    body = chat_body(600_000)  # two do not fit at once
    slow = post(srv.port, body, hold_last=True)  # reading, holding 600,000 bytes of room
    time.sleep(0.3)
    waiting = post(srv.port, body)
    assert answer(waiting, within_s=1.0) is None  # not read while the slow one holds the room
    room = health(srv.port)[1]["body_room"]
    assert room == {"held_bytes": 600_000, "limit_bytes": 1_000_000, "waiting": 1}
    status, data = answer(waiting)
    assert status == 503 and b"\r\nretry-after: 1\r\n" in data.lower()
    assert b"body_room_full" in data
    slow.sendall(body[-1:])
    assert answer(slow)[0] == 200
    assert answer(post(srv.port, body), within_s=5)[0] == 200  # the room is free again
    assert health(srv.port)[1]["body_room"]["held_bytes"] == 0
    slow.close(), waiting.close()


def test_concurrent_large_bodies_are_read_a_room_at_a_time_in_bounded_memory(serve):
    n, size = 12, 4_000_000
    srv = serve(body_room_bytes=size)  # one at a time
    body = chat_body(size)
    ready = threading.Barrier(n, timeout=2.0)
    statuses = []

    def upload():
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
        s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n".encode())
        s.sendall(memoryview(body)[:-1])  # a view: the test's own copies would count in the peak
        try:
            ready.wait()  # all uploaded but their last byte: the old code held every body at once here
        except threading.BrokenBarrierError:  # the room holds the others' bodies back: they cannot all get here
            pass
        s.sendall(memoryview(body)[-1:])
        statuses.append(answer(s, 60)[0])
        s.close()

    tracemalloc.start()
    try:
        threads = [threading.Thread(target=upload) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert statuses == [200] * n
    assert peak < 6 * size, f"peak {peak / 1e6:.0f} MB of Python memory for {n} bodies of {size / 1e6:.0f} MB"
