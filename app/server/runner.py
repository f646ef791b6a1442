"""Where the server may listen, and uvicorn running it: in a thread (the GUI, the tests, the load
test) or in front (`python -m app serve`, where Ctrl-C stops it)."""
from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time

import uvicorn

from app.server.api import DEFAULT_MAX_QUEUE, DEFAULT_QUEUE_TIMEOUT_S, ApiServer
from app.server.body import BODY_ROOM_BYTES, BODY_WAIT_S
from app.server.connections import HEADER_DEADLINE_S, guarded_protocol
from app.server.deadline import SEND_DEADLINE_S, WriteDeadline
from app.server.gateway import EngineGateway
from app.server.guards import allowed_hosts
from app.server.schema import Defaults
from backend.errors import RidgeFillError

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
# Connections and requests uvicorn takes at once before it answers 503 itself: the queue's requests, plus room
# for /health, /v1/models and the idle keep-alive connections of pooled clients (uvicorn counts those too)
MIN_CONCURRENCY = 64


class ServerConfigError(RidgeFillError):
    """The server cannot listen as asked (no key for a public address, the port is taken...)."""


def is_loopback(host: str) -> bool:
    """True when every address `host` names is a loopback one (only this machine can connect)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        addrs = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return bool(addrs) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs)


def check_bind(host: str, api_key: str | None) -> None:
    """Loopback is the default; any other address needs a key, since anyone who can reach it could use
    the model and read what the engine has cached."""
    if not is_loopback(host) and not api_key:
        raise ServerConfigError(
            f"Refusing to listen on {host} without an API key: other machines could reach it. Give one with "
            "--api-key KEY (or the RIDGEFILL_API_KEY variable), or keep the default --host 127.0.0.1.")


def bind_socket(host: str, port: int) -> socket.socket:
    """The listening socket, bound here so that a taken port fails at once with a clear message and port 0
    (any free port) can be read back."""
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError as exc:
        raise ServerConfigError(f"Cannot listen on {host}:{port}: {exc.strerror or exc}. Choose another --port "
                                "or stop the program that uses it.") from None
    sock.listen(128)
    sock.setblocking(False)
    return sock


def url_for(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


class LocalServer:
    """One OpenAI-compatible server on `host:port` in front of `gateway`.

    start() runs it on a thread of its own (returns once it accepts connections); serve_forever() runs
    it on the calling thread until Ctrl-C; stop() stops the thread. The gateway is not closed here."""

    def __init__(self, gateway: EngineGateway, *, defaults: Defaults, host: str = DEFAULT_HOST,
                 port: int = DEFAULT_PORT, api_key: str | None = None, max_queue: int = DEFAULT_MAX_QUEUE,
                 extra_hosts: tuple[str, ...] = (), origins: tuple[str, ...] = (),
                 queue_timeout_s: float = DEFAULT_QUEUE_TIMEOUT_S, send_deadline_s: float = SEND_DEADLINE_S,
                 header_deadline_s: float = HEADER_DEADLINE_S, body_room_bytes: int = BODY_ROOM_BYTES,
                 body_wait_s: float = BODY_WAIT_S):
        """`extra_hosts`: Host names answered besides loopback and `host`; `origins`: browser origins allowed;
        `send_deadline_s`: a client that takes no byte of its response for this long loses its connection;
        `header_deadline_s`: one that has not sent a request's headers this long after connecting (or after
        its last answer) loses it too; `body_room_bytes`: request bodies read and parsed at once, the others
        waiting at most `body_wait_s` (ApiServer)."""
        check_bind(host, api_key)
        self.api = ApiServer(gateway, defaults=defaults, api_key=api_key, max_queue=max_queue,
                             hosts=allowed_hosts(host, extra_hosts), origins=list(origins),
                             queue_timeout_s=queue_timeout_s, body_room_bytes=body_room_bytes,
                             body_wait_s=body_wait_s)
        # outermost, since it finds the connection on uvicorn's own send
        self.write_deadline = WriteDeadline(self.api.app, send_deadline_s, self.api.stats)
        self.host = host
        self._sock = bind_socket(host, port)
        self.port = self._sock.getsockname()[1]
        self._server = uvicorn.Server(uvicorn.Config(
            self.write_deadline, log_config=None, log_level="warning", access_log=False, lifespan="off",
            http=guarded_protocol(self.api.stats, header_deadline_s),
            limit_concurrency=max(MIN_CONCURRENCY, 4 * self.api.max_queue),
            timeout_graceful_shutdown=3))  # log_config=None: the app's logging set-up stays as it is
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return url_for(self.host, self.port)

    def serve_forever(self) -> None:
        try:
            self._server.run(sockets=[self._sock])
        finally:
            self._sock.close()

    def start(self, timeout: float = 30.0) -> "LocalServer":
        self._thread = threading.Thread(target=self.serve_forever, name="ridgefill-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise ServerConfigError(f"the server on {self.url} did not start")
            time.sleep(0.01)
        log.info("serving on %s", self.url)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop accepting, end open streams (their engine tasks are cancelled), join the thread."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(timeout)
            self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
