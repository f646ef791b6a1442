"""A request body read within limits: JSON only (415), at most MAX_BODY_BYTES (413), arrived within
BODY_TIMEOUT_S (408), then decoded by schema.decode_body (400 for NaN, Infinity, too deep a nesting).

BodyRoom bounds the memory of bodies before the queue counts them: uvicorn reads a body from the socket only
as the app asks for it (it stops reading past 64 KB held), so a request waits for room before its body is
read, and holds its room (its declared length) while the body is read and parsed. Without it, 64 connections
could each upload and parse 8 MB at once (757-809 MB of peak RSS, docs/HARDENING.md)."""
from __future__ import annotations

import asyncio
from collections import deque
from contextlib import asynccontextmanager
from typing import Any

from starlette.requests import Request

from app.server.schema import ApiError, decode_body, shown

MAX_BODY_BYTES = 8 * 1024 * 1024  # a 128K-token prompt is about 0.5 MB of text
BODY_TIMEOUT_S = 30.0  # a client that sends its body slower holds a connection for nothing
BODY_ROOM_BYTES = 4 * MAX_BODY_BYTES  # bodies read and parsed at once: four of the largest, any number of small
BODY_WAIT_S = 30.0  # waiting for room longer than this gets 503 with Retry-After


def is_json(content_type: str) -> bool:
    media = content_type.split(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def check_content_type(request: Request) -> None:
    """A POST must say its body is JSON: text/plain and form posts are what a web page sends without asking."""
    given = request.headers.get("content-type")
    if given is None or not is_json(given):
        what = f"'{shown(given)[1:-1]}'" if given is not None else "none"
        raise ApiError(415, f"The request body must be JSON sent with 'Content-Type: application/json' (the "
                       f"request gave {what}).", code="unsupported_media_type")


def _declared_size(request: Request) -> int:
    try:
        return int(request.headers.get("content-length") or 0)
    except ValueError:
        return 0  # the HTTP server refuses a malformed length before here; counted as it arrives otherwise


def body_size(request: Request, max_bytes: int = MAX_BODY_BYTES) -> int:
    """The room a body needs: its declared length, or `max_bytes` when it comes chunked (no length said);
    ApiError 413 when its length says it is too large."""
    size = _declared_size(request)
    if size > max_bytes:
        raise ApiError(413, f"The request body has {size:,} bytes; at most {max_bytes:,} are accepted.",
                       code="request_too_large")
    if "chunked" in request.headers.get("transfer-encoding", "").lower():
        return max_bytes
    return size


class BodyRoom:
    """At most `limit` bytes of request bodies being read and parsed at once; the others wait their turn in
    arrival order (a small body does not pass a large one that waits), at most `wait_s`, then get 503."""

    def __init__(self, limit: int = BODY_ROOM_BYTES, wait_s: float = BODY_WAIT_S):
        self.limit, self.wait_s = max(1, int(limit)), wait_s
        self.held = 0  # bytes of the bodies being read or parsed now
        self._waiting: deque[tuple[int, asyncio.Future]] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def as_dict(self) -> dict:
        return {"held_bytes": self.held, "limit_bytes": self.limit, "waiting": self.waiting}

    def _wake(self) -> None:
        while self._waiting and self.held + self._waiting[0][0] <= self.limit:
            n, fut = self._waiting.popleft()
            if not fut.done():
                self.held += n
                fut.set_result(None)

    @asynccontextmanager
    async def hold(self, size: int):
        """Room for a body of `size` bytes (at most the whole room) while the block runs; ApiError 503 after
        `wait_s` without it."""
        n = min(max(0, size), self.limit)
        if not self._waiting and self.held + n <= self.limit:
            self.held += n
        else:
            await self._wait(n)
        try:
            yield
        finally:
            self.held -= n
            self._wake()

    async def _wait(self, n: int) -> None:
        fut = asyncio.get_running_loop().create_future()
        entry = (n, fut)
        self._waiting.append(entry)
        try:
            await asyncio.wait_for(asyncio.shield(fut), self.wait_s)
        except BaseException as exc:  # the wait ran out, or the request was cancelled
            if fut.done() and not fut.cancelled():  # given room just as it ended: hand it on
                self.held -= n
            else:
                fut.cancel()
                self._waiting.remove(entry)
            self._wake()
            if isinstance(exc, TimeoutError):
                raise ApiError(503, f"The server is reading other requests' bodies ({self.limit:,} bytes at most "
                               f"at once) and had no room for this one within {self.wait_s:.0f} s; retry after the "
                               "seconds in Retry-After.", type="server_error", code="body_room_full") from None
            raise


async def read_json(request: Request, *, max_bytes: int = MAX_BODY_BYTES, timeout: float = BODY_TIMEOUT_S) -> Any:
    """The body, decoded; ApiError 413 when too large (before reading, when its length says so), 408 when it
    does not arrive in time, 400 when it is not JSON."""
    body_size(request, max_bytes)
    body = bytearray()
    try:
        async with asyncio.timeout(timeout):
            async for part in request.stream():
                body += part
                if len(body) > max_bytes:
                    raise ApiError(413, f"The request body is larger than {max_bytes:,} bytes.",
                                   code="request_too_large")
    except TimeoutError:
        raise ApiError(408, f"The request body did not arrive within {timeout:.0f} s ({len(body):,} bytes came); "
                       "send it again.", code="request_timeout") from None
    return decode_body(body)  # json reads a bytearray as it is: no copy of the body
