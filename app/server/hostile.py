"""Hostile and unlucky clients for the load test (issue 39): each sends one kind of bad request and
knows the 4xx it must get, or (a disconnect) that it must leave the server as it was. While the queue
is full a request is turned away with 503 `queue_full` before its body is read (the server cannot know
yet that the body is bad, and reading it would cost what the limit saves): counted apart, as turned away.

`run_hostile` loops over them on one thread while the well-formed clients of `run_load` run, and
counts what each got: the status expected, another status (a 5xx above all), or no answer.
"""
from __future__ import annotations

import http.client
import json
import socket
import threading
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import urlsplit

CHAT = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}
JSON = {"Content-Type": "application/json"}


@dataclass
class HostileReport:
    sent: int = 0
    as_expected: int = 0
    queue_full: int = 0  # turned away by a full queue before the body was read
    unexpected: Counter = field(default_factory=Counter)  # "case: got status" -> times

    def count(self, name: str, got: tuple[int | None, str], want: tuple[int, ...]) -> None:
        self.sent += 1
        if got[0] in want:
            self.as_expected += 1
        elif got == (503, "queue_full"):
            self.queue_full += 1
        else:
            self.unexpected[f"{name}: {got[0]} {got[1]}".strip()] += 1

    def summary(self) -> dict:
        return {"sent": self.sent, "as_expected": self.as_expected, "turned_away_queue_full": self.queue_full,
                "unexpected": dict(self.unexpected),
                "server_errors": sum(n for k, n in self.unexpected.items() if ": 5" in k)}


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


def _disconnect_mid_stream(url: str, timeout: float) -> int | None:
    """A streamed request whose client reads the status line and goes away: the server must cancel it."""
    u = urlsplit(url)
    body = json.dumps({**CHAT, "max_tokens": 64, "stream": True}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\nContent-Type: application/json"
            f"\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    try:
        with socket.create_connection((u.hostname, u.port), timeout=timeout) as s:
            s.sendall(head + body)
            first = s.recv(64)  # the status line: the engine has started on it
        return int(first.split()[1]) if first.startswith(b"HTTP/1.1 ") else None
    except (OSError, ValueError, IndexError):
        return None


def run_hostile(url: str, stop: threading.Event, *, timeout: float = 60.0) -> HostileReport:
    """Send the hostile cases in turn (and a client that disconnects mid-stream) until `stop` is set."""
    report = HostileReport()
    while not stop.is_set():
        for name, want, path, body, headers in _cases():
            report.count(name, _post(url, path, body, headers, timeout), (want,))
        status = _disconnect_mid_stream(url, timeout)  # its 200 (then gone), or 503 while the queue is full
        report.count("disconnect mid-stream", (status, "queue_full" if status == 503 else ""), (200,))
        stop.wait(0.5)  # a round a second or so: hostile, not a flood
    return report
