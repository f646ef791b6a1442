"""Connections that send no request: a deadline for a request's headers, and room made for a new client.

uvicorn counts every open connection toward its `limit_concurrency` and answers 503 at the limit, but it
starts no timer before a connection's first request, and any byte received stops its keep-alive timer. So
64 connections that never sent a request (or sent a byte a minute) locked every other client out for as
long as they stayed open. `guarded_protocol` gives uvicorn's own HTTP/1.1 connection (h11) two rules:

- a connection that waits for a request (none sent yet, or its last answer sent) and has not sent the
  whole of the next one's headers within `header_deadline_s` is closed;
- a new connection that finds every place taken closes the connections that have waited longest with no
  request in progress, so that its own request is served; a request being answered is never closed.
"""
from __future__ import annotations

import asyncio
import logging
from collections import Counter

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

# A request's headers are a few hundred bytes, sent at once by a live client; 10 s leaves a slow link room
# and frees a stuck place sooner than the 30 s a body gets (body.py)
HEADER_DEADLINE_S = 10.0


def guarded_protocol(stats: Counter, header_deadline_s: float = HEADER_DEADLINE_S) -> type[H11Protocol]:
    """uvicorn's h11 connection class with the two rules; `stats` counts the connections closed, as
    `closed_no_request` (the deadline) and `closed_for_room` (the server's /health shows its stats)."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,),
                {"stats": stats, "header_deadline_s": float(header_deadline_s)})


class GuardedH11Protocol(H11Protocol):
    stats: Counter = Counter()
    header_deadline_s = HEADER_DEADLINE_S
    _deadline: asyncio.TimerHandle | None = None
    waiting_since = 0.0  # the loop's time when it began to wait for a request

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_waiting()
        self._make_room()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._start_waiting()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        super().connection_lost(exc)

    def waiting_for_request(self) -> bool:
        """No request in progress: its headers are not all here yet, or its answer has been sent."""
        return (self.cycle is None or self.cycle.response_complete) and not self.transport.is_closing()

    def _start_waiting(self) -> None:
        self.waiting_since = self.loop.time()
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(self.header_deadline_s, self._deadline_passed)

    def _deadline_passed(self) -> None:
        self._deadline = None
        if self.waiting_for_request():  # else a request came in time, and its answer's end starts a new wait
            self._close("sent no request within %.0f s" % self.header_deadline_s, "closed_no_request")

    def _make_room(self) -> None:
        if self.limit_concurrency is None:
            return
        open_ones = [c for c in self.connections if not c.transport.is_closing()]
        # uvicorn answers 503 when, at a request's headers, its count of connections reaches the limit
        excess = len(open_ones) - (self.limit_concurrency - 1)
        idle = sorted((c for c in open_ones if c is not self and isinstance(c, GuardedH11Protocol)
                       and c.waiting_for_request()), key=lambda c: c.waiting_since)
        for conn in idle[:max(0, excess)]:
            conn._close("waited longest with no request while every place was taken", "closed_for_room")

    def _close(self, why: str, counted_as: str) -> None:
        peer = "%s:%d" % self.client if self.client else "a client"
        log.warning("the connection of %s %s: closing it", peer, why)
        self.stats[counted_as] += 1
        try:
            self.conn.send(h11.ConnectionClosed())
        except h11.LocalProtocolError:  # in the middle of a request's headers
            pass
        self.transport.close()
