"""An engine on another machine: an OpenAI-compatible server (this app's `serve`, llama.cpp's server, vLLM).

`RemoteEngine.complete(request)` takes the CompletionRequest the local engine takes (the documents in the
messages, as app/chat_session.py builds them) and returns a CompletionResult, streaming TokenEvents as the
text arrives. Time to first token and the answer's throughput are measured here, on the client; the
server's own `timings` (llama.cpp's server and ours send them) are kept beside them, as sent.

A server is this app's own when its /v1/models entries say `owned_by: ridgefill-desktop`. Only then does a
request carry the RidgeFill mode, split and tail, and only then does the answer come with sources, mapped
back from the server's "messages[i]" offsets to the documents and their pages. Other servers get neither:
nothing is faked for them.

Every failure is a RemoteError whose message names the server (without credentials) and says what to do
(errors.py's rule); what it sent is read within limits (app/remote_wire.py) and checked for its types
(app/remote_reply.py). `RemoteSource` runs answers on worker threads as a task source (submit / cancel /
poll, the messages of app/job_runner.py), so the GUI's TaskClient drives a remote engine as it drives the
local engine child.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import urlsplit

import httpx2

from app.engine_protocol import TaskKind
from app.job_runner import JobRunner
from app.remote_reply import OURS, Reply, count_in, place_sources, read_models, server_timings
from app.remote_wire import (
    MAX_EVENT_BYTES,
    MAX_MODELS_BYTES,
    BadReply,
    CutShort,
    Hold,
    RemoteError,
    StatusError,
    Wire,
    excerpt,
    plain_http_warning,
    pumped,
    split_credentials,
)
from app.task_stream import Task
from backend.documents import framed
from backend.protocol import CompletionRequest, CompletionResult, Timings, TokenEvent
from backend.sampling import RANDOM_SEED

__all__ = ["OURS", "RemoteEngine", "RemoteError", "RemoteResult", "RemoteSource", "ServerInfo", "api_base"]
log = logging.getLogger(__name__)
CONNECT_TIMEOUT_S = 10.0
# Silence allowed between two pieces of a reply: a long document's prefill sends nothing before its first token
READ_TIMEOUT_S = 600.0
# The llama.cpp sampling fields that llama.cpp's server, vLLM and ours all take beside OpenAI's
LLAMA_SAMPLING = ("top_k", "min_p", "repeat_penalty")
# The rest only this app's server is sent (llama.cpp's names; others would refuse or ignore them)
OUR_SAMPLING = ("repeat_last_n", "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n")


@dataclass
class ServerInfo:
    url: str  # the API's base, ending in /v1
    models: list[str]
    ours: bool  # this app's `serve`: RidgeFill controls and sources work over the wire
    meta: dict = field(default_factory=dict)  # our server's model meta (n_ctx, n_layer, default split...)


@dataclass
class RemoteResult(CompletionResult):
    """A remote answer: `extra` goes into the chat's timings beside the client's own (ui/format.py shows it)."""
    extra: dict = field(default_factory=dict)  # engine (who answered), server (its timings, as sent)


def address(url: str) -> tuple[str, str]:
    """(the API's base URL, the key its `user:pass@` held or "") from what a person types: "host:8080",
    "http://host:8080/", ".../v1". The base never holds credentials: it is shown and stored."""
    url = url.strip().rstrip("/")
    if not url:
        raise RemoteError("Give the server's address, e.g. http://192.168.1.20:8080.")
    if "://" not in url:
        url = "http://" + url
    try:
        url, key = split_credentials(url)
        parts = urlsplit(url)
        parts.port  # noqa: B018 - a port that is not a number raises here, not at the first request
    except ValueError:
        raise RemoteError(f"{address_without_credentials(url)} is not a server address; give one like "
                          "http://192.168.1.20:8080.") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RemoteError(f"{url} is not a server address; give one like http://192.168.1.20:8080.")
    return (url if parts.path.endswith("/v1") else url + "/v1"), key


def address_without_credentials(url: str) -> str:
    """`url` with anything before an "@" in its host part left out, for a message about an address that
    does not parse."""
    scheme, sep, rest = url.partition("://")
    return scheme + sep + rest.split("/", 1)[0].rpartition("@")[2] if sep else url


def api_base(url: str) -> str:
    """The API's base URL from what a person types (without its credentials)."""
    return address(url)[0]


class RemoteEngine:
    """One model on one OpenAI-compatible server, over HTTP (app/remote_wire.py)."""

    def __init__(self, url: str, api_key: str = "", model: str = "", *, read_timeout_s: float = READ_TIMEOUT_S,
                 connect_timeout_s: float = CONNECT_TIMEOUT_S):
        self.url, url_key = address(url)
        self.model = model
        self.read_timeout_s = read_timeout_s
        self.info: ServerInfo | None = None
        self.warning = plain_http_warning(self.url)
        if self.warning:
            log.warning("%s", self.warning)
        self.wire = Wire(self.url, api_key or url_key, read_timeout_s, connect_timeout_s)

    @property
    def server(self) -> str:
        """The server as a person names it: its address without /v1."""
        return self.url[:-3]

    @property
    def name(self) -> str:
        return f"{self.model or 'the model'} at {self.server}"

    @property
    def ours(self) -> bool:
        return bool(self.info and self.info.ours)

    def probe(self, cancelled: Callable[[], bool] = lambda: False) -> ServerInfo | None:
        """GET /v1/models: the models, and whether the server is this app's; the first model unless one was
        chosen. None if `cancelled` turned true first."""
        hold = Hold()
        try:
            got = list(pumped(iter_one(lambda: self.wire.get_json("models", MAX_MODELS_BYTES, hold)), cancelled,
                              hold))
            if not got:
                return None
            ids, ours, meta = read_models(got[0])
        except Exception as exc:  # noqa: BLE001 - every failure becomes a RemoteError naming the server
            raise explain(exc, self, when="reading its models") from None
        if not ids:
            raise RemoteError(f"The server {self.server} lists no model. Load a model on it, then add it again.")
        self.info = ServerInfo(self.url, ids, ours, meta)
        self.model = self.model or ids[0]
        return self.info

    def complete(self, request: CompletionRequest, on_event: Callable[[Any], None] | None = None,
                 cancelled: Callable[[], bool] = lambda: False,
                 on_cancel: Callable[[Callable[[], None]], None] | None = None) -> RemoteResult:
        """Ask the server, streaming; the answer with the client's TTFT and throughput, the server's timings
        where sent, and (this app's server) the sources. A stop (`cancelled`, looked at every 50 ms, headers
        or not; `on_cancel` registers a way to cut the connection at once) returns what arrived, finish_reason
        "cancelled"."""
        request = framed(request)  # the chat sends the documents apart from the turns: framed on this job's thread
        reply = Reply(t0=time.perf_counter())
        hold = Hold()
        if on_cancel is not None:
            on_cancel(hold.stop)
        try:
            if self.info is None and self.probe(cancelled) is None:
                return self.result(request, reply, "cancelled")
            for chunk in pumped(self.wire.events("chat/completions", as_sent(self.body(request)), hold), cancelled,
                                hold):
                piece = reply.take(chunk)
                if piece and on_event is not None:
                    on_event(TokenEvent(-1, piece))
            if cancelled():
                return self.result(request, reply, "cancelled")
            if reply.finish is None:
                raise RemoteError(f"The server {self.server} ended the answer before finishing it"
                                  + (f" ({reply.length:,} characters arrived and are kept)" if reply.parts else "")
                                  + ". Send the question again; if it keeps happening, look at the server's log.")
            return self.result(request, reply, reply.finish)
        except Exception as exc:  # noqa: BLE001 - a stop cuts the stream under the loop: any error then is the cut
            if cancelled():
                return self.result(request, reply, "cancelled")
            raise explain(exc, self, got=reply.text) from None

    def body(self, request: CompletionRequest) -> dict:
        """The request as the server takes it: OpenAI's fields; llama.cpp's sampling fields; RidgeFill's only
        for this app's server."""
        body: dict = {"model": self.model, "stream": True, "stream_options": {"include_usage": True},
                      "max_tokens": request.max_tokens,
                      "messages": [{"role": m.role, "content": m.content} for m in request.messages or []]}
        if request.stop:
            body["stop"] = list(request.stop)
        extra: dict = {}
        s = request.sampling
        if s is not None:
            body.update(temperature=s.temperature, top_p=s.top_p, presence_penalty=s.presence_penalty,
                        frequency_penalty=s.frequency_penalty)
            if s.seed != RANDOM_SEED:
                body["seed"] = s.seed
            extra.update({k: getattr(s, k) for k in LLAMA_SAMPLING + (OUR_SAMPLING if self.ours else ())})
        if self.ours:
            rf = {"mode": request.mode, "split": request.split, "tail": request.tail,
                  "quality_share": request.quality_share, "reuse_prefix": request.reuse_prefix}
            extra["ridgefill"] = {k: v for k, v in rf.items() if v is not None}
        if extra:
            body["extra_body"] = extra
        return body

    def result(self, request: CompletionRequest, reply: Reply, finish: str) -> RemoteResult:
        server = server_timings(reply.timings)
        usage = reply.usage
        n = count_in(usage, "completion_tokens") or count_in(server, "predicted_n") or reply.pieces
        gen_ms = (reply.last - reply.first) * 1000 if reply.first is not None else 0.0
        t = Timings(prompt_n=count_in(usage, "prompt_tokens") or count_in(server, "prompt_n"),
                    predicted_n=n, predicted_ms=gen_ms,
                    predicted_per_second=(n - 1) / (gen_ms / 1000) if gen_ms > 0 and n > 1 else 0.0,
                    ttft_ms=(reply.first - reply.t0) * 1000 if reply.first is not None else 0.0)
        if server:  # the server's own prefill, as it measured it
            t.prompt_ms = float(server.get("prompt_ms") or 0.0)
            t.prompt_per_second = float(server.get("prompt_per_second") or 0.0)
            t.cache_n = count_in(server, "cache_n")
        if self.ours and server:
            mode = server.get("mode")
            t.mode = mode if isinstance(mode, str) else "off"
            t.split, t.tail = server.get("split"), server.get("tail")
            t.bulk_n, t.exact_n = count_in(server, "bulk_n"), count_in(server, "exact_n")
            t.note = server["note"] if isinstance(server.get("note"), str) else ""
            t.sources_ms = float(server.get("sources_ms") or 0.0)
        sources = place_sources(reply.sources or [], request) if self.ours else []
        extra = {"engine": self.name, "server": server,
                 "sources_note": "" if self.ours else "no sources: this server does not send them"}
        return RemoteResult(text=reply.text, finish_reason=finish, timings=t,
                            prompt_tokens=t.prompt_n, sources=sources, extra=extra)


def as_sent(body: dict) -> dict:
    """The JSON sent: `extra_body` (the openai client's name for fields beyond OpenAI's) merged in."""
    return {**{k: v for k, v in body.items() if k != "extra_body"}, **body.get("extra_body", {})}


def iter_one(fetch: Callable[[], Any]):
    """A generator of `fetch()`'s one value, for pumped() (which reads it on a thread of its own)."""
    yield fetch()


def explain(exc: BaseException, engine: RemoteEngine, *, when: str = "answering", got: str = "") -> RemoteError:
    """A failure as the person at the client can act on it: the server's address, what it sent, what to do."""
    where = f"The server {engine.server}"
    kept = f" ({len(got):,} characters had arrived; they are kept)" if got else ""
    if isinstance(exc, RemoteError):
        return exc
    if isinstance(exc, StatusError):
        return explain_status(exc, engine, where, when, kept)
    if isinstance(exc, BadReply):
        return RemoteError(f"{where} sent {exc} while {when}{kept}. It may not be an OpenAI-compatible server, or "
                           "something in between (a proxy, a login page) answered for it: check the address.")
    if isinstance(exc, CutShort):
        return RemoteError(f"{where} cut its reply short while {when} ({len(exc.got):,} bytes arrived: "
                           f"{excerpt(exc.got)}). Try again; if it keeps happening, look at the server's log.")
    if isinstance(exc, httpx2.SSEError):  # an event past MAX_EVENT_BYTES (the content type is checked before)
        return RemoteError(f"{where} sent a chunk over {MAX_EVENT_BYTES:,} bytes while {when}{kept} (this app reads "
                           "at most that). It may not be an OpenAI-compatible server: check the address.")
    if isinstance(exc, httpx2.TimeoutException) and not isinstance(exc, httpx2.ConnectTimeout):
        return RemoteError(f"{where} sent nothing for {engine.read_timeout_s:.0f} s while {when}{kept}. It may be "
                           "overloaded or stuck: try again later, or check the server.")
    if isinstance(exc, (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.UnsupportedProtocol)):
        return RemoteError(f"Cannot reach the server {engine.server} ({type(exc).__name__}: {exc}). Check the "
                           "address and that the server is running and reachable from this machine.")
    if isinstance(exc, httpx2.TransportError):
        return RemoteError(f"The connection to {engine.server} dropped while {when}{kept} ({type(exc).__name__}: "
                           f"{exc}). Send the question again.")
    return RemoteError(f"{where} sent something this app cannot read while {when}{kept} ({type(exc).__name__}: "
                       f"{excerpt(str(exc))}). Check that the address is an OpenAI-compatible server.")


def explain_status(exc: StatusError, engine: RemoteEngine, where: str, when: str, kept: str) -> RemoteError:
    """A non-2xx reply: what its status means for the person asking."""
    status, said = exc.status, exc.said
    if status == 401:
        return RemoteError(f"{where} refused the API key (401: {said}). Check the key given for this server.")
    if status == 404:
        return RemoteError(f"{where} has no model '{engine.model}' (404: {said}). Read its model list "
                           "again and choose one of them.")
    if status == 429:
        after = exc.retry_after if exc.retry_after and len(exc.retry_after) <= 40 else None
        return RemoteError(f"{where} is busy (429: {said}). Wait " + (f"{after} s" if after else "a moment")
                           + " and send the question again.")
    if status == 400 and "context" in said.lower():
        return RemoteError(f"The documents and question do not fit the context of {engine.name} ({said}). "
                           "Attach less text, or use a server that runs the model with a larger context.")
    if status >= 500:
        return RemoteError(f"{where} failed while {when} ({status}: {said}){kept}. Try again; if it keeps "
                           "failing, look at the server's log.")
    return RemoteError(f"{where} refused the request ({status}: {said}).")


class RemoteSource:
    """A task source (submit / cancel / poll, its pending tasks in its runner's table) whose COMPLETE tasks a
    RemoteEngine answers on worker threads; other kinds fail with a message saying the server does not do them."""

    def __init__(self, engine: RemoteEngine):
        self.engine = engine
        self.runner = JobRunner("remote-engine")

    def submit(self, kind, payload) -> int:
        return self.submit_task(Task(kind, payload)).id

    def submit_task(self, task: Task) -> Task:
        kind, payload = task.kind, task.payload
        if kind == TaskKind.COMPLETE:
            return self.runner.submit_task(task, lambda ctx: self.engine.complete(
                payload, on_event=ctx.emit, cancelled=lambda: ctx.cancelled, on_cancel=ctx.on_cancel))
        return self.runner.submit_task(task, lambda ctx: _not_remote(kind, self.engine))

    @property
    def tasks(self):
        return self.runner.tasks

    @property
    def busy(self) -> bool:
        return self.runner.busy

    def cancel(self, task_id: int) -> None:
        self.runner.cancel(task_id)

    def poll(self, on_message=None) -> list:
        return self.runner.poll(on_message=on_message)

    def shutdown(self, timeout: float = 5.0) -> None:
        self.runner.shutdown(timeout)


def _not_remote(kind, engine: RemoteEngine):
    raise RemoteError(f"{engine.name} answers questions only; {getattr(kind, 'value', kind)} runs on this machine's "
                      "engine.")
