"""The write deadline (issue 39): the real server (uvicorn on a loopback port) in front of a fake engine that
streams 8 tokens of 1 KB a millisecond until its answer's max_tokens or a cancel. A raw socket client that sends a
streamed request and never reads loses its connection within seconds, its engine task is cancelled and the
next request is answered; a slow reader that keeps taking bytes is not cut, though each of its sends waits
longer than the deadline."""
from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
import time

import pytest

from app.engine_protocol import TaskDone, TaskEvent, TaskKind
from app.server.api import EngineRun
from app.server.schema import Defaults, parse_request
from app.task_stream import Task as Ticket  # the gateway's task, as the fakes name it
from backend.protocol import CompletionResult, Timings, TokenEvent
from backend.sampling import GREEDY
from tests.test_server_hardening import CHAT, FakeGateway

DEADLINE_S = 2.0
JSON = {"Content-Type": "application/json"}


PIECE = " word" * 200  # a token's text: 1 KB, so that the kernel's send buffer (it grows to MBs) fills in seconds


class StreamingGateway(FakeGateway):
    """Answers on a thread of its own, 8 tokens of 1 KB a millisecond, up to the request's max_tokens; a cancel
    stops it."""

    def __init__(self):
        super().__init__("answer")
        self.cancelled: list[int] = []

    def submit(self, kind, payload, deliver) -> Ticket:
        self.submitted += 1
        ticket = Ticket(kind, payload, deliver)
        ticket.task_id = self.submitted
        threading.Thread(target=self._answer, args=(ticket,), daemon=True).start()
        return ticket

    def _answer(self, ticket: Ticket) -> None:
        n = 0
        while n < ticket.payload.max_tokens and not ticket.cancel_requested:
            ticket.deliver(TaskEvent(ticket.task_id, TokenEvent(n, PIECE)))
            n += 1
            if n % 8 == 0:
                time.sleep(0.001)
        reason = "cancelled" if ticket.cancel_requested else "length"
        ticket.deliver(TaskDone(ticket.task_id, CompletionResult(PIECE * n, reason, Timings(predicted_n=n), 3)))

    def cancel(self, ticket) -> None:
        ticket.cancel_requested = True
        self.cancelled.append(ticket.task_id)


@pytest.fixture
def served():
    from app.server.runner import LocalServer

    gw = StreamingGateway()
    srv = LocalServer(gw, defaults=Defaults("off", sampling=GREEDY), port=0, max_queue=1,
                      send_deadline_s=DEADLINE_S).start()
    yield gw, srv
    srv.stop()


def open_stream(port: int, max_tokens: int) -> socket.socket:
    """A streamed chat request sent by hand on a socket with a small receive window; nothing read yet."""
    body = json.dumps({**CHAT, "max_tokens": max_tokens, "stream": True}).encode()
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)  # before connect: the window the server sees
    s.connect(("127.0.0.1", port))
    s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return s


def health(port: int) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/health")
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


def test_a_client_that_stops_reading_loses_its_connection_and_frees_the_engine(served):
    gw, srv = served
    s = open_stream(srv.port, max_tokens=1_000_000)  # about 1 GB of events: far past every buffer
    try:
        t0 = time.monotonic()
        reset = 0
        while not reset and time.monotonic() - t0 < 20:  # never read: only ask the socket whether it was reset
            time.sleep(0.1)
            reset = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        took = time.monotonic() - t0
        assert reset, "the server still holds the connection of a client that stopped reading 20 s ago"
        assert took < 15, took  # the buffers fill, then 2 s with no byte taken
    finally:
        s.close()
    deadline = time.monotonic() + 10
    while (h := health(srv.port))["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.05)
    # the engine task was cancelled (the answer had a million tokens to go) and its only queue slot is free
    assert gw.cancelled == [1] and h["in_flight"] == 0, h
    assert h["stats"]["cut_not_reading"] == 1 and h["stats"]["cancelled_client_gone"] == 1, h
    assert len(srv._server.server_state.connections) <= 1  # uvicorn's count: only /health's own, if still open
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    conn.request("POST", "/v1/chat/completions", body=json.dumps({**CHAT, "max_tokens": 5}), headers=JSON)
    r = conn.getresponse()
    assert (r.status, json.loads(r.read())["usage"]["completion_tokens"]) == (200, 5)
    conn.close()


def test_a_slow_reader_that_keeps_reading_is_not_cut(served):
    gw, srv = served
    s = open_stream(srv.port, max_tokens=3_000)  # about 3 MB of events: past the buffers
    got = bytearray()
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 4 * DEADLINE_S:  # 10 KB/s: a send waits ~5 s for 48 KB to be taken
            got += s.recv(1024)
            time.sleep(0.1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)  # the rest at full speed: a 64 KB window
        s.settimeout(20)
        while not got.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n") and (more := s.recv(65536)):  # chunked
            got += more
    finally:
        s.close()
    assert got.startswith(b"HTTP/1.1 200") and got.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"), bytes(got[-200:])
    assert got.count(b'"content": " word') == 3_000
    h = health(srv.port)
    assert "cut_not_reading" not in h["stats"] and gw.cancelled == [], h


def test_a_run_asked_to_stop_twice_cancels_its_engine_task_once():
    """The disconnect watcher and the closed stream both stop a run whose client left (CI saw [1, 1])."""
    async def stop_twice(gw):
        parsed = parse_request({**CHAT, "max_tokens": 1_000_000}, chat=True, defaults=Defaults("off"), n_layer=30)
        run = EngineRun(gw, TaskKind.COMPLETE, parsed.request)
        run.cancel()
        run.cancel()
        while not isinstance(await run.get(), TaskDone):
            pass

    gw = StreamingGateway()
    asyncio.run(stop_twice(gw))
    assert gw.cancelled == [1]
