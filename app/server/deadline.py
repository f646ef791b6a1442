"""A write deadline: a client that stops taking its response loses its connection (issue 39).

uvicorn writes a response into the connection's transport and, once more than 64 KiB wait there, its
`send` waits for the client to take some, with no limit: a client that sends a streamed request and
stops reading would hold its connection (and the response's coroutine) until it closed, and enough of
them fill uvicorn's connection limit. `WriteDeadline` wraps `send` and watches the bytes waiting for the
client (in the transport and the kernel's send queue): when the client has taken none of them for `deadline_s` (while a `send` waits, or after the
last one while the response's tail waits), it logs who and why and resets the connection. The response
then ends as it does for a client that went away (api.py cancels the engine task at once); a slow reader
that keeps taking bytes is never cut, however long its response takes.

It must wrap the app uvicorn runs (runner.py): the transport is found on uvicorn's `send`, a method of
the request's cycle. Under any other server (Starlette's TestClient) it passes requests through.
"""
from __future__ import annotations

import asyncio
import fcntl
import logging
import socket
import struct
import termios
from collections import Counter

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)

# No byte taken for this long: the client has stopped reading (a live link, even a slow one, takes some
# bytes within seconds); the same 30 s a request body gets to arrive (body.py)
SEND_DEADLINE_S = 30.0


def transport_of(send: Send) -> asyncio.Transport | None:
    """The connection's transport behind uvicorn's `send` (a method of its RequestResponseCycle), else None."""
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    return transport if isinstance(transport, asyncio.WriteTransport) else None


def waiting(transport: asyncio.WriteTransport) -> int:
    """Bytes written and not yet taken by the client: the transport's buffer and the kernel's send queue (which
    grows to MBs, so a slow reader's progress shows there first; Linux's TIOCOUTQ, elsewhere 0)."""
    queued = 0
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.fileno() >= 0 and hasattr(termios, "TIOCOUTQ"):  # -1: closed
        try:
            queued = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
        except OSError:  # closed meanwhile
            pass
    return transport.get_write_buffer_size() + queued


def who(scope: Scope) -> str:
    client = scope.get("client")
    peer = f"{client[0]}:{client[1]}" if client else "a client"
    return f"{peer} ({scope.get('method', '')} {scope.get('path', '')})"


class WriteDeadline:
    """ASGI middleware: abort the connection of a client that takes no byte of its response for `deadline_s`."""

    def __init__(self, app: ASGIApp, deadline_s: float = SEND_DEADLINE_S, stats: Counter | None = None):
        """`stats`: counts the connections cut, as `cut_not_reading` (the server's /health shows its stats)."""
        self.app = app
        self.deadline_s = float(deadline_s)
        self.tick_s = min(1.0, self.deadline_s / 4)  # how often the waiting bytes are counted
        self.stats = Counter() if stats is None else stats

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        transport = transport_of(send) if scope["type"] == "http" and self.deadline_s > 0 else None
        if transport is None:
            await self.app(scope, receive, send)
            return

        async def send_in_time(message: Message) -> None:
            if transport.get_write_buffer_size() <= transport.get_write_buffer_limits()[0]:
                # at or below the low-water mark the transport is not paused, so uvicorn's send does not wait
                await send(message)
                return
            sending = asyncio.ensure_future(send(message))
            try:
                in_time = await self._taken(transport, sending)
            finally:
                if not sending.done():
                    sending.cancel()  # it waits for room before it writes: cancelled, it has written nothing
            if in_time:
                sending.result()  # its own error, if it had one
            else:
                self._abort(scope, transport)

        await self.app(scope, receive, send_in_time)
        if not await self._taken(transport):  # the response's last bytes, which no send waits for
            self._abort(scope, transport)

    async def _taken(self, transport: asyncio.WriteTransport, sending: asyncio.Future | None = None) -> bool:
        """Wait until `sending` is done (without it: until the transport has sent everything); False as soon
        as the client has taken no byte for `deadline_s`."""
        loop = asyncio.get_running_loop()
        left, progressed = waiting(transport), loop.time()
        while not (sending.done() if sending is not None else transport.get_write_buffer_size() == 0):
            if sending is not None:
                await asyncio.wait({sending}, timeout=self.tick_s)
            else:
                await asyncio.sleep(self.tick_s)
            now = waiting(transport)
            if now < left:
                progressed = loop.time()
            elif loop.time() - progressed >= self.deadline_s and not (sending is not None and sending.done()):
                return False
            left = now
        return True

    def _abort(self, scope: Scope, transport: asyncio.WriteTransport) -> None:
        log.warning("%s took no byte of its response for %.0f s (%d bytes waiting): closing its connection",
                    who(scope), self.deadline_s, waiting(transport))
        self.stats["cut_not_reading"] += 1
        sock = transport.get_extra_info("socket")
        if sock is not None:  # a reset, not a FIN queued behind bytes the client will not take: it is told now
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()  # close() would wait for those bytes to be sent first, that is, forever
