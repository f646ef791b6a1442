"""A request body read within limits: JSON only (415), at most MAX_BODY_BYTES (413), arrived within
BODY_TIMEOUT_S (408), then decoded by schema.decode_body (400 for NaN, Infinity, too deep a nesting)."""
from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request

from app.server.schema import ApiError, decode_body, shown

MAX_BODY_BYTES = 8 * 1024 * 1024  # a 128K-token prompt is about 0.5 MB of text
BODY_TIMEOUT_S = 30.0  # a client that sends its body slower holds a connection for nothing


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


async def read_json(request: Request, *, max_bytes: int = MAX_BODY_BYTES, timeout: float = BODY_TIMEOUT_S) -> Any:
    """The body, decoded; ApiError 413 when too large (before reading, when its length says so), 408 when it
    does not arrive in time, 400 when it is not JSON."""
    size = _declared_size(request)
    if size > max_bytes:
        raise ApiError(413, f"The request body has {size:,} bytes; at most {max_bytes:,} are accepted.",
                       code="request_too_large")
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
    return decode_body(bytes(body))
