"""Hostile and unlucky clients for the load test (issue 39): each sends one kind of bad request and
knows the 4xx it must get, or (a disconnect) that it must leave the server as it was.

`run_hostile` loops over them on one thread while the well-formed clients of `run_load` run, and
counts what each got: the status expected, another status (a 5xx above all), or no answer.
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


@dataclass
class HostileReport:
    sent: int = 0
    as_expected: int = 0
    unexpected: Counter = field(default_factory=Counter)  # "case: got status" -> times

    def summary(self) -> dict:
        return {"sent": self.sent, "as_expected": self.as_expected, "unexpected": dict(self.unexpected),
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


def _post(url: str, path: str, body: bytes, headers: dict, timeout: float) -> int | None:
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        conn.request("POST", path, body=body, headers=headers)
        r = conn.getresponse()
        r.read()
        return r.status
    except OSError:
        return None
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
            got = _post(url, path, body, headers, timeout)
            report.sent += 1
            if got == want:
                report.as_expected += 1
            else:
                report.unexpected[f"{name}: {got}"] += 1
        got = _disconnect_mid_stream(url, timeout)  # 200 (then gone) or 503 when the queue is full: both fine
        report.sent += 1
        if got in (200, 503):
            report.as_expected += 1
        else:
            report.unexpected[f"disconnect mid-stream: {got}"] += 1
        time.sleep(0.05)
    return report
