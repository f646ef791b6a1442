"""Hostile and unlucky clients for the load test (issue 39): each sends one kind of bad request and
knows the 4xx it must get, or (a disconnect, a slow reader, a client that stops reading) that it must
leave the server as it was. While the queue is full a request is turned away with 429 `queue_full`
before its body is read (the server cannot know yet that the body is bad, and reading it would cost
what the limit saves): counted apart, as turned away.

`run_hostile` loops over them on one thread (the readers on threads of their own) while the well-formed
clients of `run_load` run, and counts what each got: the status expected, another status (a 5xx above
all), or no answer; and every status by class (2xx, 4xx, 5xx, none).
"""
from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import urlsplit

CHAT = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}
JSON = {"Content-Type": "application/json"}
# the readers of a streamed answer (slow_reader's arguments): a byte a second for 10 s; nothing for 10 s
READERS = (("slow reader", {"byte_s": 1.0, "reads": 10}), ("stops reading", {"reads": 0, "hold_s": 10}))


@dataclass
class HostileReport:
    sent: int = 0
    as_expected: int = 0
    queue_full: int = 0  # turned away by a full queue before the body was read
    unexpected: Counter = field(default_factory=Counter)  # "case: got status" -> times
    classes: Counter = field(default_factory=Counter)  # "2xx", "4xx", "5xx", "none" -> times
    lock: threading.Lock = field(default_factory=threading.Lock)  # the readers count from their own threads

    def count(self, name: str, got: tuple[int | None, str], want: tuple[int, ...]) -> None:
        with self.lock:
            self.sent += 1
            self.classes["none" if got[0] is None else f"{got[0] // 100}xx"] += 1
            if got[0] in want:
                self.as_expected += 1
            elif got == (429, "queue_full"):
                self.queue_full += 1
            else:
                self.unexpected[f"{name}: {got[0]} {got[1]}".strip()] += 1

    def summary(self) -> dict:
        return {"sent": self.sent, "as_expected": self.as_expected, "turned_away_queue_full": self.queue_full,
                "unexpected": dict(self.unexpected), "by_class": dict(self.classes),
                "server_errors": self.classes["5xx"]}


def _cases() -> list[tuple[str, int, str, bytes, dict]]:
    """(name, status expected, path, body, headers)."""
    chat = json.dumps(CHAT).encode()
    return [
        ("oversized body", 413, "/v1/chat/completions", b" " * (8 * 1024 * 1024 + 1), JSON),
        ("NaN temperature", 400, "/v1/chat/completions", chat[:-1] + b', "temperature": NaN}', JSON),
        ("nesting 100,000 deep", 400, "/v1/chat/completions", b"[" * 100_000, JSON),
        ("DRY window 2^31-1", 400, "/v1/chat/completions",
         json.dumps({**CHAT, "dry_multiplier": 0.8, "dry_penalty_last_n": 2**31 - 1}).encode(), JSON),
        ("text/plain body", 415, "/v1/chat/completions", chat, {"Content-Type": "text/plain"}),
        ("cross-origin page", 403, "/v1/chat/completions", chat, {**JSON, "Origin": "http://attacker.example"}),
        ("rebound Host", 403, "/v1/chat/completions", chat, {**JSON, "Host": "attacker.example"}),
    ]


def _post(url: str, path: str, body: bytes, headers: dict, timeout: float) -> tuple[int | None, str]:
    """(status, the error's code) of one POST; (None, why) when no answer came."""
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        conn.request("POST", path, body=body, headers=headers)
        r = conn.getresponse()
        raw = r.read()
        try:
            return r.status, str(json.loads(raw)["error"]["code"])
        except (ValueError, KeyError, TypeError):
            return r.status, ""
    except OSError as exc:
        return None, type(exc).__name__
    finally:
        conn.close()


def _stream_head(url: str, max_tokens: int = 64) -> tuple[tuple[str, int], bytes]:
    """The address and the bytes of one streamed chat request sent by hand."""
    u = urlsplit(url)
    body = json.dumps({**CHAT, "max_tokens": max_tokens, "stream": True}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\nContent-Type: application/json"
            f"\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    return (u.hostname, u.port), head + body


def _status(first: bytes) -> tuple[int | None, str]:
    """(status, "queue_full" for a 429) from the first bytes of an answer."""
    try:
        status = int(first.split()[1]) if first.startswith(b"HTTP/1.1 ") else None
    except (ValueError, IndexError):
        return None, "no status line"
    return status, "queue_full" if status == 429 else ""


def _disconnect_mid_stream(url: str, timeout: float) -> tuple[int | None, str]:
    """A streamed request whose client reads the status line and goes away: the server must cancel it."""
    address, request = _stream_head(url)
    try:
        with socket.create_connection(address, timeout=timeout) as s:
            s.sendall(request)
            return _status(s.recv(64))  # the status line: the engine has started on it
    except OSError as exc:
        return None, type(exc).__name__


def slow_reader(url: str, *, byte_s: float = 1.0, reads: int = 5, hold_s: float = 0.0,
                timeout: float = 60.0) -> tuple[int | None, str]:
    """A streamed request read a byte every `byte_s` seconds for `reads` bytes after the status line, then
    (`hold_s`) not read at all for that long, then dropped: neither may hold the engine. 16 tokens: some
    2,500 bytes of events, past its receive window (1 KiB)."""
    address, request = _stream_head(url, 16)
    try:
        with socket.create_connection(address, timeout=timeout) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)  # a small window: the server's writes stall
            s.sendall(request)
            got = _status(s.recv(12))
            for _ in range(reads if got[0] == 200 else 0):
                time.sleep(byte_s)
                if not s.recv(1):
                    break
            time.sleep(hold_s if got[0] == 200 else 0)
            return got
    except OSError as exc:
        return None, type(exc).__name__


def run_hostile(url: str, stop: threading.Event, *, timeout: float = 600.0) -> HostileReport:
    """Send the hostile cases in turn (a client that disconnects mid-stream, and on threads of their own a
    slow reader and one that stops reading) until `stop` is set. `timeout`: a client's patience, as long as
    the server's own deadline for a queued request (a loaded engine may take minutes to start on one)."""
    report = HostileReport()
    readers: list[threading.Thread] = []

    def reader(name: str, **kw) -> None:  # its 200 (then it reads slowly or not at all), or a 429
        report.count(name, slow_reader(url, timeout=timeout, **kw), (200,))

    while not stop.is_set():
        readers = [t for t in readers if t.is_alive()]
        if len(readers) < 2:  # at most two at once: each holds a connection for several seconds
            for name, kw in READERS:
                readers.append(threading.Thread(target=reader, args=(name,), kwargs=kw, daemon=True))
                readers[-1].start()
        for name, want, path, body, headers in _cases():
            report.count(name, _post(url, path, body, headers, timeout), (want,))
        report.count("disconnect mid-stream", _disconnect_mid_stream(url, timeout), (200,))
        stop.wait(0.5)  # a round a second or so: hostile, not a flood
    for t in readers:
        t.join(timeout)
    return report
