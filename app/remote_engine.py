"""An engine on another machine: an OpenAI-compatible server (this app's `serve`, llama.cpp's server, vLLM).

`RemoteEngine.complete(request)` takes the CompletionRequest the local engine takes (the documents in the
messages, as app/chat_session.py builds them) and returns a CompletionResult, streaming TokenEvents as the
text arrives. Time to first token and the answer's throughput are measured here, on the client; the
server's own `timings` (llama.cpp's server and ours send them) are kept beside them, as sent.

A server is this app's own when its /v1/models entries say `owned_by: ridgefill-desktop`. Only then does a
request carry the RidgeFill mode, split and tail, and only then does the answer come with sources, mapped
back from the server's "messages[i]" offsets to the documents and their pages. Other servers get neither:
nothing is faked for them.

Every failure is a RemoteError whose message names the server and says what to do (errors.py's rule).
`RemoteSource` runs answers on worker threads as a task source (submit / cancel / poll, the messages of
app/job_runner.py), so the GUI's TaskClient drives a remote engine as it drives the local engine child.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import urlsplit

import openai

from app.engine_protocol import TaskKind
from app.job_runner import JobRunner
from backend.errors import RidgeFillError
from backend.protocol import CompletionRequest, CompletionResult, Timings, TokenEvent
from backend.sampling import RANDOM_SEED
from backend.sources import Source

OURS = "ridgefill-desktop"  # the owned_by of this app's /v1/models entries (app/server/schema.py model_card)
CONNECT_TIMEOUT_S = 10.0
# Silence allowed between two pieces of a reply: a long document's prefill sends nothing before its first token
READ_TIMEOUT_S = 600.0
# The llama.cpp sampling fields that llama.cpp's server, vLLM and ours all take beside OpenAI's
LLAMA_SAMPLING = ("top_k", "min_p", "repeat_penalty")
# The rest only this app's server is sent (llama.cpp's names; others would refuse or ignore them)
OUR_SAMPLING = ("repeat_last_n", "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n")


class RemoteError(RidgeFillError):
    """A server refused, failed or could not be reached; the message names it and says what to do."""


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


def api_base(url: str) -> str:
    """The API's base URL from what a person types: "host:8080", "http://host:8080/", ".../v1"."""
    url = url.strip().rstrip("/")
    if not url:
        raise RemoteError("Give the server's address, e.g. http://192.168.1.20:8080.")
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RemoteError(f"{url} is not a server address; give one like http://192.168.1.20:8080.")
    return url if parts.path.endswith("/v1") else url + "/v1"


class RemoteEngine:
    """One model on one OpenAI-compatible server, through the official openai client."""

    def __init__(self, url: str, api_key: str = "", model: str = "", *, read_timeout_s: float = READ_TIMEOUT_S,
                 connect_timeout_s: float = CONNECT_TIMEOUT_S):
        self.url = api_base(url)
        self.model = model
        self.read_timeout_s = read_timeout_s
        self.info: ServerInfo | None = None
        self.client = openai.OpenAI(base_url=self.url, api_key=api_key or "none", max_retries=0,
                                    timeout=openai.Timeout(read_timeout_s, connect=connect_timeout_s))

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

    def probe(self) -> ServerInfo:
        """GET /v1/models: the models, and whether the server is this app's; the first model unless one was
        chosen."""
        try:
            data = list(self.client.models.list().data)
        except openai.APIError as exc:
            raise explain(exc, self, when="reading its models") from None
        ids = [m.id for m in data]
        if not ids:
            raise RemoteError(f"The server {self.server} lists no model. Load a model on it, then add it again.")
        ours = any(getattr(m, "owned_by", "") == OURS for m in data)
        meta = (data[0].model_extra or {}).get("meta") or {} if ours else {}
        self.info = ServerInfo(self.url, ids, ours, meta if isinstance(meta, dict) else {})
        self.model = self.model or ids[0]
        return self.info

    def complete(self, request: CompletionRequest, on_event: Callable[[Any], None] | None = None,
                 cancelled: Callable[[], bool] = lambda: False,
                 on_cancel: Callable[[Callable[[], None]], None] | None = None) -> RemoteResult:
        """Ask the server, streaming; the answer with the client's TTFT and throughput, the server's timings
        where sent, and (this app's server) the sources. A stop (`cancelled`; `on_cancel` registers a way to
        cut the stream at once) returns what arrived, finish_reason "cancelled"."""
        if self.info is None:
            self.probe()
        reply = Reply(t0=time.perf_counter())
        stream = None
        try:
            stream = self.client.chat.completions.create(**self.body(request))
            if on_cancel is not None:
                on_cancel(stream.close)
            for chunk in stream:
                if cancelled():
                    break
                piece = reply.take(chunk)
                if piece and on_event is not None:
                    on_event(TokenEvent(-1, piece))
        except Exception as exc:  # noqa: BLE001 - a stop cuts the stream under the loop: any error then is the cut
            if not cancelled():
                if isinstance(exc, openai.APIError):
                    raise explain(exc, self, got=reply.text, streaming=stream is not None) from None
                raise
        if cancelled():
            reply.finish = "cancelled"
        elif reply.finish is None:
            raise RemoteError(f"The server {self.server} ended the answer before finishing it"
                              + (f" ({len(reply.text):,} characters arrived and are kept)" if reply.text else "")
                              + ". Send the question again; if it keeps happening, look at the server's log.")
        return self.result(request, reply)

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

    def result(self, request: CompletionRequest, reply: "Reply") -> RemoteResult:
        server = reply.timings if isinstance(reply.timings, dict) else None
        usage = reply.usage or {}
        n = int(usage.get("completion_tokens") or (server or {}).get("predicted_n") or reply.pieces)
        gen_ms = (reply.last - reply.first) * 1000 if reply.first is not None else 0.0
        t = Timings(prompt_n=int(usage.get("prompt_tokens") or (server or {}).get("prompt_n") or 0),
                    predicted_n=n, predicted_ms=gen_ms,
                    predicted_per_second=(n - 1) / (gen_ms / 1000) if gen_ms > 0 and n > 1 else 0.0,
                    ttft_ms=(reply.first - reply.t0) * 1000 if reply.first is not None else 0.0)
        if server:  # the server's own prefill, as it measured it
            t.prompt_ms = float(server.get("prompt_ms") or 0.0)
            t.prompt_per_second = float(server.get("prompt_per_second") or 0.0)
            t.cache_n = int(server.get("cache_n") or 0)
        if self.ours and server:
            t.mode, t.split, t.tail = server.get("mode", "off"), server.get("split"), server.get("tail")
            t.bulk_n, t.exact_n, t.note = server.get("bulk_n", 0), server.get("exact_n", 0), server.get("note", "")
            t.sources_ms = float(server.get("sources_ms") or 0.0)
        sources = place_sources(reply.sources or [], request) if self.ours else []
        extra = {"engine": self.name, "server": server,
                 "sources_note": "" if self.ours else "no sources: this server does not send them"}
        return RemoteResult(text=reply.text, finish_reason=reply.finish or "stop", timings=t,
                            prompt_tokens=t.prompt_n, sources=sources, extra=extra)


@dataclass
class Reply:
    """What a stream brought so far, and when (perf_counter seconds)."""
    t0: float
    parts: list = field(default_factory=list)
    first: float | None = None
    last: float = 0.0
    pieces: int = 0
    finish: str | None = None
    timings: Any = None
    sources: Any = None
    usage: dict | None = None

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def take(self, chunk) -> str:
        extra = chunk.model_extra or {}
        if extra.get("timings") is not None:
            self.timings = extra["timings"]
        if extra.get("sources") is not None:
            self.sources = extra["sources"]
        if chunk.usage is not None:
            self.usage = chunk.usage.model_dump()
        piece = ""
        for choice in chunk.choices or []:
            piece += (choice.delta.content or "") if choice.delta is not None else ""
            if choice.finish_reason:
                self.finish = "length" if choice.finish_reason == "length" else "stop"
        if piece:
            now = time.perf_counter()
            self.first = now if self.first is None else self.first
            self.last = now
            self.pieces += 1
            self.parts.append(piece)
        return piece


def place_sources(raw: list, request: CompletionRequest) -> list[Source]:
    """Our server's sources point into the request's messages ("messages[i]", offsets into its content): put
    them back into the documents they fall in, with their pages. One outside every document keeps its place."""
    msgs = request.messages or []
    out = []
    for s in raw:
        if not isinstance(s, dict):
            continue
        name, start, end = str(s.get("document", "")), int(s.get("start", 0)), int(s.get("end", 0))
        page = s.get("page")
        i = int(name[9:-1]) if name.startswith("messages[") and name[9:-1].isdigit() else -1
        for d in request.documents or []:
            body = d.text.strip()
            at = msgs[i].content.find(body) if 0 <= i < len(msgs) and body else -1
            if at >= 0 and at <= start < at + len(body):
                lead = len(d.text) - len(d.text.lstrip())  # the message holds the stripped text
                name, start, end = d.name, start - at + lead, end - at + lead
                page = d.page_at(start)
                break
        out.append(Source(name, page, start, end, str(s.get("text", "")), float(s.get("score", 0.0))))
    return out


def explain(exc: openai.APIError, engine: RemoteEngine, *, when: str = "answering", got: str = "",
            streaming: bool = False) -> RemoteError:
    """A server's error as the person at the client can act on it; `streaming`: the reply had begun (a lost
    connection then dropped, where before it could not be made)."""
    where = f"The server {engine.server}"
    kept = f" ({len(got):,} characters had arrived; they are kept)" if got else ""
    if isinstance(exc, openai.APIStatusError):
        status, said = exc.status_code, _said(exc)
        if status == 401:
            return RemoteError(f"{where} refused the API key (401: {said}). Check the key given for this server.")
        if status == 404:
            return RemoteError(f"{where} has no model '{engine.model}' (404: {said}). Read its model list "
                               "again and choose one of them.")
        if status == 429:
            after = exc.response.headers.get("retry-after")
            return RemoteError(f"{where} is busy (429: {said}). Wait "
                               + (f"{after} s" if after else "a moment") + " and send the question again.")
        if status == 400 and "context" in said.lower():
            return RemoteError(f"The documents and question do not fit the context of {engine.name} ({said}). "
                               "Attach less text, or use a server that runs the model with a larger context.")
        if status >= 500:
            return RemoteError(f"{where} failed while {when} ({status}: {said}){kept}. Try again; if it keeps "
                               "failing, look at the server's log.")
        return RemoteError(f"{where} refused the request ({status}: {said}).")
    if isinstance(exc, openai.APITimeoutError):
        return RemoteError(f"{where} sent nothing for {engine.read_timeout_s:.0f} s while {when}{kept}. It may be "
                           "overloaded or stuck: try again later, or check the server.")
    if isinstance(exc, openai.APIConnectionError) and not streaming:
        cause = exc.__cause__ or exc
        return RemoteError(f"Cannot reach the server {engine.server} ({type(cause).__name__}: {cause}). Check the "
                           "address and that the server is running and reachable from this machine.")
    cause = exc.__cause__ or exc
    return RemoteError(f"The connection to {engine.server} dropped while {when}{kept} ({type(cause).__name__}: "
                       f"{cause}). Send the question again.")


def _said(exc: openai.APIStatusError) -> str:
    """The server's own words: OpenAI's {"error": {"message"}} (the client hands over the inner object),
    FastAPI's {"detail"}, or the status line."""
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error") if isinstance(body.get("error"), dict) else body
        msg = inner.get("message") or inner.get("detail")
        if msg:
            return str(msg)[:500]
    return str(exc.message)[:500]


class RemoteSource:
    """A task source (submit / cancel / poll) whose COMPLETE tasks a RemoteEngine answers on worker threads;
    other kinds fail with a message saying the server does not do them."""

    def __init__(self, engine: RemoteEngine):
        self.engine = engine
        self.runner = JobRunner("remote-engine")

    def submit(self, kind, payload) -> int:
        if kind == TaskKind.COMPLETE:
            return self.runner.submit("answer", lambda ctx: self.engine.complete(
                payload, on_event=ctx.emit, cancelled=lambda: ctx.cancelled, on_cancel=ctx.on_cancel))
        return self.runner.submit(str(kind), lambda ctx: _not_remote(kind, self.engine))

    def cancel(self, task_id: int) -> None:
        self.runner.cancel(task_id)

    def poll(self) -> list:
        return self.runner.poll()

    def shutdown(self, timeout: float = 5.0) -> None:
        self.runner.shutdown(timeout)


def _not_remote(kind, engine: RemoteEngine):
    raise RemoteError(f"{engine.name} answers questions only; {getattr(kind, 'value', kind)} runs on this machine's "
                      "engine.")
