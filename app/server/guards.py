"""Who may call the server from a browser: the Host and Origin checks in front of every route.

A web page the user opens can send requests to a server on 127.0.0.1 (a `text/plain` POST needs no
CORS preflight), and with DNS rebinding (a name of the page's that resolves to 127.0.0.1) it can read
the answers too, as Ollama's CVE-2024-28224 showed. So:
- Host: loopback names, the address the server listens on and what `--allowed-host` adds; a rebound
  name is none of them. Listening on every address (0.0.0.0, ::) needs a key, which is the guard there,
  and the names the machine is reached by are not known, so any Host passes.
- Origin: a request with an Origin header (browsers send one on every cross-origin POST) is refused
  unless `--allowed-origin` names it; clients that are not browsers (the openai library, curl) send none.
Starlette's own middleware does the matching: TrustedHostMiddleware's Host parsing and patterns,
CORSMiddleware's origins (it also answers an allowed origin's preflight and adds the CORS headers).
"""
from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from app.server.schema import ApiError, shown

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
_PASSED = "ridgefill.host_allowed"  # set in the scope by the inner app TrustedHostMiddleware calls when it allows


def allowed_hosts(bind_host: str, extra: Iterable[str] = ()) -> list[str]:
    """The Host names a server listening on `bind_host` answers: loopback, its own address, `extra`;
    ["*"] (any) when it listens on every address."""
    host = bind_host.strip("[]")
    try:
        if ipaddress.ip_address(host).is_unspecified:
            return ["*"]
        literal = f"[{host}]" if ":" in host else host  # an IPv6 Host header brackets the address
    except ValueError:
        literal = host
    names = [*LOOPBACK_HOSTS, literal.lower(), *(h.strip().lower() for h in extra if h.strip())]
    return list(dict.fromkeys(names))


def _refusal(status: int, message: str, code: str) -> JSONResponse:
    return JSONResponse(ApiError(status, message, code=code).body, status_code=status)


async def _mark_passed(scope: Scope, receive: Receive, send: Send) -> None:
    scope[_PASSED] = True


async def _discard(message) -> None:
    pass


class HostGuard:
    """Requests whose Host header is not allowed get 403 with how to allow it (TrustedHostMiddleware decides)."""

    def __init__(self, app: ASGIApp, hosts: list[str]):
        self.app = app
        self.hosts = hosts
        self._check = TrustedHostMiddleware(_mark_passed, allowed_hosts=hosts, www_redirect=False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._check(scope, receive, _discard)  # its own plain-text refusal is dropped for ours
            if not scope.pop(_PASSED, False):
                host = Headers(scope=scope).get("host")
                await _refusal(403, f"This server does not answer requests for host {shown(host)}; it answers "
                               f"{', '.join(self.hosts)}. Start it with --allowed-host NAME to add one.",
                               "host_not_allowed")(scope, receive, send)
                return
        await self.app(scope, receive, send)


class OriginGuard:
    """Requests from a browser page of an origin not allowed get 403; allowed origins get CORS's headers."""

    def __init__(self, app: ASGIApp, origins: list[str]):
        self.origins = origins
        self.cors = CORSMiddleware(app, allow_origins=origins, allow_methods=("GET", "POST"),
                                   allow_headers=("Authorization", "Content-Type"))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            origin = Headers(scope=scope).get("origin")
            if origin is not None and not self.cors.is_allowed_origin(origin):
                await _refusal(403, f"Requests from web pages of origin {shown(origin)} are refused here; start "
                               "the server with --allowed-origin ORIGIN to let that page use it.",
                               "origin_not_allowed")(scope, receive, send)
                return
        await self.cors(scope, receive, send)
