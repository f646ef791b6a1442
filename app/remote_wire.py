"""The remote engine's HTTP side (app/remote_engine.py): every byte a server sends is read here, within limits,
on a thread of its own so that a stop returns at once, and every way it can fail is a RemoteError that names
the server (its address without credentials) and quotes a little of what it sent.

httpx2 is the openai client's own HTTP library (the pinned openai depends on it); it is used directly because
the openai client reads a whole body (an error page, the model list) before the caller can bound it, and
cannot be stopped before a response's headers arrive. Its EventSource parses the stream, bounded per event.
"""
from __future__ import annotations

import ipaddress
import json
import logging
import queue
import socket
import threading
from typing import Any, Callable, Iterator
from urllib.parse import urlsplit, urlunsplit

import httpx2

from backend.errors import RidgeFillError

log = logging.getLogger(__name__)

# One stream event (a chunk): a delta is a few tokens; our last one carries timings and up to 3 passages
MAX_EVENT_BYTES = 1_048_576
# The answer: 128K tokens (the largest context served) at about 4 characters each is 512K; twice that
MAX_ANSWER_CHARS = 1_000_000
# Events in one answer: one a token for 128K tokens, four times over (empty keep-alive chunks included)
MAX_EVENTS = 500_000
# GET /v1/models: a server lists a handful of models; a few thousand entries is far past any real list
MAX_MODELS_BYTES = 4_194_304
MAX_MODELS = 4_000
# A model id: a name or llama.cpp's model path (PATH_MAX is 4,096)
MAX_MODEL_ID_CHARS = 4_096
# Sources: our server sends up to 3 passages of a few hundred characters each
MAX_SOURCES = 64
MAX_SOURCE_CHARS = 100_000
# An error reply: only its message is shown, and only the first few hundred characters of it
MAX_ERROR_BYTES = 65_536
EXCERPT_CHARS = 160  # what an error quotes of a reply
POLL_S = 0.05  # how often a waiting answer looks at the stop flag
QUEUED_EVENTS = 256  # events read ahead of the caller (each at most MAX_EVENT_BYTES)


class RemoteError(RidgeFillError):
    """A server refused, failed or could not be reached; the message names it and says what to do."""


class StatusError(Exception):
    """A reply whose status is not 2xx: the status, the server's own words, and its Retry-After."""

    def __init__(self, status: int, said: str, retry_after: str | None):
        super().__init__(f"{status}: {said}")
        self.status, self.said, self.retry_after = status, said, retry_after


class CutShort(Exception):
    """A reply whose connection dropped before its body was whole: what had arrived."""

    def __init__(self, got: bytes, cause: Exception):
        super().__init__(str(cause))
        self.got, self.cause = got, cause


def excerpt(data: bytes | str | Any) -> str:
    """A short, one-line quote of what a server sent, for an error message."""
    if not isinstance(data, (bytes, str)):
        data = json.dumps(data, default=repr)[:4 * EXCERPT_CHARS] if _jsonable(data) else repr(data)
    text = data[:4 * EXCERPT_CHARS].decode("utf-8", "replace") if isinstance(data, bytes) else data[:4 * EXCERPT_CHARS]
    text = " ".join(text.split())
    return repr(text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS] + "…")


def _jsonable(value) -> bool:
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError, RecursionError):
        return False


def split_credentials(url: str) -> tuple[str, str]:
    """(the address without `user:pass@`, the password, else the user name): credentials are never kept in
    an address, which is shown in every answer's line and stored with each chat."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=host)), parts.password or parts.username or ""


def plain_http_warning(url: str) -> str:
    """A warning for plain http to a host outside this machine ("" for https or loopback)."""
    parts = urlsplit(url)
    host = (parts.hostname or "").strip("[]")
    if parts.scheme != "http" or host == "localhost" or host.endswith(".localhost"):
        return ""
    try:
        if ipaddress.ip_address(host).is_loopback:
            return ""
    except ValueError:
        pass
    return (f"{host} is reached over plain http: the documents' text, the questions and the API key cross the "
            "network unencrypted. Use https, or a server on this machine or a network you trust.")


class Wire:
    """One server's HTTP client: no connection is kept between requests, so each request's socket is its own
    and a stop can shut it (the `trace` extension hands it over as soon as it connects)."""

    def __init__(self, base_url: str, api_key: str, read_timeout_s: float, connect_timeout_s: float):
        self.base_url = base_url
        self.client = httpx2.Client(
            base_url=base_url + "/", timeout=httpx2.Timeout(read_timeout_s, connect=connect_timeout_s),
            limits=httpx2.Limits(max_keepalive_connections=0), follow_redirects=False,
            headers={"Authorization": f"Bearer {api_key or 'none'}", "Accept-Encoding": "identity"})

    def get_json(self, path: str, limit: int, hold: "Hold") -> Any:
        """GET `path`: its body as JSON, at most `limit` bytes."""
        with self.client.stream("GET", path, extensions={"trace": hold.trace}) as response:
            check_status(response)
            data = read_capped(response, limit, "its model list")
        try:
            return json.loads(data)
        except (ValueError, RecursionError):
            raise BadReply(f"a model list that is not JSON: {excerpt(data)}") from None

    def events(self, path: str, body: dict, hold: "Hold") -> Iterator[Any]:
        """POST `body` to `path` and yield each stream event's JSON (at most MAX_EVENT_BYTES an event)."""
        with self.client.stream("POST", path, json=body, extensions={"trace": hold.trace}) as response:
            check_status(response)
            kind = response.headers.get("content-type", "").partition(";")[0].strip().lower()
            if kind != "text/event-stream":
                got = read_capped(response, EXCERPT_CHARS * 4, "", cut=True)
                raise BadReply(f"{kind or 'a reply with no type'}, not an event stream: {excerpt(got)}")
            for sse in httpx2.EventSource(response, max_event_size=MAX_EVENT_BYTES):
                if sse.data.strip() == "[DONE]":
                    return
                if sse.event == "error" or not sse.data:  # llama.cpp's `error:` events carry their JSON too
                    if sse.event == "error":
                        raise BadReply(f"an error in its stream: {excerpt(sse.data)}")
                    continue
                try:
                    yield json.loads(sse.data)
                except (ValueError, RecursionError):
                    raise BadReply(f"a chunk that is not JSON: {excerpt(sse.data)}") from None

    def close(self) -> None:
        self.client.close()


class BadReply(Exception):
    """A reply this app cannot read: what it was, with a quote."""


def check_status(response: httpx2.Response) -> None:
    """A non-2xx reply as a StatusError with the server's own words (at most MAX_ERROR_BYTES are read)."""
    if 200 <= response.status_code < 300:
        return
    raw = read_capped(response, MAX_ERROR_BYTES, "", cut=True)
    raise StatusError(response.status_code, said_in(raw, response.reason_phrase), response.headers.get("retry-after"))


def said_in(raw: bytes, reason: str) -> str:
    """The server's words in an error body: OpenAI's {"error": {"message"}}, {"error": "..."}, FastAPI's
    {"detail"}, {"message"}; else a quote of the body, else the status line."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        body = None
    if isinstance(body, dict):
        inner = body.get("error") if isinstance(body.get("error"), dict) else body
        for key in ("message", "detail", "error"):
            if isinstance(inner.get(key), str) and inner[key]:
                return " ".join(inner[key].split())[:500]
    return excerpt(raw) if raw.strip() else (reason or "no reason given")


def read_capped(response: httpx2.Response, limit: int, what: str, *, cut: bool = False) -> bytes:
    """The body, at most `limit` bytes: past it a BadReply naming `what` (or, `cut`, what arrived so far)."""
    got = bytearray()
    try:
        for part in response.iter_bytes():
            got += part
            if len(got) > limit:
                if cut:
                    return bytes(got[:limit])
                raise BadReply(f"{what} over {limit:,} bytes (this app reads at most that): {excerpt(bytes(got))}")
    except (httpx2.RemoteProtocolError, httpx2.ReadError) as exc:
        if cut:
            return bytes(got)
        raise CutShort(bytes(got), exc) from None
    return bytes(got)


class Hold:
    """A request's socket, held so that a stop (from any thread) can shut it and wake its read at once."""

    def __init__(self):
        self.lock = threading.Lock()
        self.sock: socket.socket | None = None
        self.stopped = False

    def trace(self, event: str, info: dict) -> None:
        if event.endswith("connect_tcp.complete") and info.get("return_value") is not None:
            with self.lock:
                self.sock = info["return_value"].get_extra_info("socket")
                stopped = self.stopped
            if stopped:
                self.stop()

    def stop(self) -> None:
        with self.lock:
            self.stopped, sock = True, self.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def pumped(items: Iterator, cancelled: Callable[[], bool], hold: Hold) -> Iterator:
    """What `items` yields, read on a thread of its own: the caller returns within POLL_S of `cancelled()`
    turning true, headers or not, and the socket is shut so the reading thread ends too."""
    box: queue.Queue = queue.Queue(maxsize=QUEUED_EVENTS)
    done = threading.Event()

    def put(entry) -> bool:
        while not done.is_set():
            try:
                box.put(entry, timeout=POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def pump() -> None:
        try:
            for item in items:
                if not put(("item", item)):
                    return
            put(("end", None))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, who explains it
            put(("error", exc))
        finally:
            items.close()

    threading.Thread(target=pump, name="remote-read", daemon=True).start()
    try:
        while not cancelled():
            try:
                kind, value = box.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if kind == "end":
                return
            if kind == "error":
                raise value
            yield value
    finally:
        done.set()
        hold.stop()
