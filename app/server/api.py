"""The HTTP side: a Starlette app with OpenAI's routes in front of one engine.

Routes: GET /health, GET /v1/models, GET /v1/models/{id}, POST /v1/chat/completions, POST /v1/completions.

- One engine, one request at a time: requests are submitted in arrival order and the engine child
  serves them oldest first. At most `max_queue` requests wait or run at once; one more is turned away
  with 429 and `Retry-After` (too many requests: the client's share, not a fault; OpenAI answers so and
  its client retries), before its body is read. 5xx is kept for the server's own faults: the engine not
  ready (503), not started on a request within `queue_timeout_s` (503: stuck or far behind), silent for
  `stall_timeout_s` while answering (504): a stuck engine gives every client an error, not a hang.
- Browsers: Host and Origin allow-lists (app/server/guards.py); bodies: JSON only, bounded in size and
  time, and in memory before the queue counts them: at most `body_room_bytes` of bodies are read and
  parsed at once, the others wait their turn (app/server/body.py's BodyRoom).
- A client that goes away cancels its request: the engine stops at its next check (between prefill
  chunks or tokens) and takes the next one. The work done so far stays cached, like Stop in the chat.
- Prefix reuse as in the chat: a request that starts with what the engine has cached (the same
  document, the conversation so far) prefills only the rest (`timings.cache_n`).
- A streamed answer starts (status 200 and the first chunk) only once the engine has started on the
  request, so a prompt too long for the context still gets its 400, with the token counts.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections import Counter
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from app.engine_messages import CANCELLED, DONE, EVENT, FAILED, is_end, kind_of
from app.engine_protocol import CountRequest, CountResult, TaskFailed, TaskKind
from app.server.body import BODY_ROOM_BYTES, BODY_WAIT_S, BodyRoom, body_size, check_content_type, read_json
from app.server.gateway import EngineGateway
from app.server.guards import HostGuard, OriginGuard, allowed_hosts
from app.server.schema import (
    ApiError,
    Defaults,
    Parsed,
    chunk,
    finish_reason,
    model_card,
    new_id,
    parse_request,
    response,
    shown,
    usage_chunk,
)
from app.task_stream import LoopReader
from backend.protocol import TokenEvent

log = logging.getLogger(__name__)

DEFAULT_MAX_QUEUE = 16
# Waiting for the engine to start on a request: long enough for a full queue of long prefills on a slow CPU
DEFAULT_QUEUE_TIMEOUT_S = 600.0
# Silence from the engine while it runs a request: it sends a message per prefill chunk and per token
DEFAULT_STALL_TIMEOUT_S = 120.0


def model_id(info) -> str:
    """The id clients send as `model`: the GGUF file's name without .gguf (as llama.cpp's server does)."""
    return Path(info.model_path).stem


class EngineRun(LoopReader):
    """One engine task seen from the event loop: its messages, in order, in an asyncio queue (app/task_stream.py's
    LoopReader listening to the gateway's Task).

    The run lets go of its task when the end arrives: run -> task -> its listener -> run is a cycle, and
    kept, each ended request's prompt waited for the garbage collector (under many large requests some 7 of
    them were still held: tests/test_server_admission.py). The listener keeps the run alive until then, so
    a request whose client left is still counted when it ends."""

    def __init__(self, gateway: EngineGateway, kind: TaskKind, payload: Any, on_end=None):
        super().__init__(on_end)
        self._gateway = gateway
        self.client_gone = False
        self._cancel_sent = False
        self.ticket = gateway.submit(kind, payload, self.deliver_threadsafe)

    def _arrived(self, msg) -> None:  # the loop's thread
        if is_end(msg) and self.end is None:
            self.ticket = None  # the cycle through the task ends here (see the class)
        super()._arrived(msg)

    def cancel(self) -> None:
        """Ask the engine to stop the task, once: the disconnect watcher and a closed stream may both ask."""
        if self.end is None and not self._cancel_sent:
            self._cancel_sent = True
            self._gateway.cancel(self.ticket)


class ApiServer:
    """The app and what it keeps between requests: the key, the queue limit, the defaults, counters."""

    def __init__(self, gateway: EngineGateway, *, defaults: Defaults, api_key: str | None = None,
                 max_queue: int = DEFAULT_MAX_QUEUE, hosts: list[str] | None = None, origins: list[str] = (),
                 queue_timeout_s: float = DEFAULT_QUEUE_TIMEOUT_S, stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
                 body_room_bytes: int = BODY_ROOM_BYTES, body_wait_s: float = BODY_WAIT_S):
        """`hosts`: the Host names answered (default: loopback ones, guards.allowed_hosts); `origins`: the
        browser origins allowed (default none); `body_room_bytes`: bodies read and parsed at once, a request
        waiting at most `body_wait_s` for room (then 503)."""
        self.gateway = gateway
        self.defaults = defaults
        self.api_key = api_key or None
        self.max_queue = max(1, int(max_queue))
        self.queue_timeout_s, self.stall_timeout_s = queue_timeout_s, stall_timeout_s
        self.in_flight = 0  # requests submitted to the engine and not ended there (waiting or running)
        self.body_room = BodyRoom(body_room_bytes, body_wait_s)
        self.stats: Counter = Counter()
        self.app = Starlette(
            middleware=[Middleware(HostGuard, hosts=allowed_hosts("localhost") if hosts is None else list(hosts)),
                        Middleware(OriginGuard, origins=list(origins))],
            routes=[
                Route("/health", self.health, methods=["GET"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/v1/models/{model_id:path}", self.model, methods=["GET"]),
                Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
                Route("/v1/completions", self.completions, methods=["POST"]),
            ],
            exception_handlers={ApiError: self._api_error, HTTPException: self._http_error,
                                Exception: self._server_error},
        )

    # ---- errors ------------------------------------------------------------------------------------
    async def _api_error(self, request: Request, exc: ApiError) -> JSONResponse:
        self.stats[f"rejected_{exc.status}"] += 1
        log.info("%s %s -> %s %s", request.method, request.url.path, exc.status, exc.body["error"]["message"])
        headers = {"Retry-After": "1"} if exc.status in (429, 503) else None
        if exc.status == 401:
            headers = {"WWW-Authenticate": "Bearer"}
        return JSONResponse(exc.body, status_code=exc.status, headers=headers)

    async def _http_error(self, request: Request, exc: HTTPException) -> JSONResponse:
        what = "route" if exc.status_code == 404 else "method"
        err = ApiError(exc.status_code, f"No {what} {request.method} {request.url.path} here; see GET /v1/models, "
                       "POST /v1/chat/completions, POST /v1/completions, GET /health.", code="not_found")
        return await self._api_error(request, err)

    async def _server_error(self, request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        self.stats["failed"] += 1
        return JSONResponse(ApiError(500, f"internal server error: {type(exc).__name__}", type="server_error").body,
                            status_code=500)

    # ---- checks ------------------------------------------------------------------------------------
    def _check_key(self, request: Request) -> None:
        if self.api_key is None:
            return
        auth = request.headers.get("authorization", "")
        given = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        if not given:
            raise ApiError(401, "This server needs an API key: send it as 'Authorization: Bearer KEY'.",
                           code="missing_api_key")
        if not hmac.compare_digest(given.encode(), self.api_key.encode()):
            raise ApiError(401, "Incorrect API key provided.", code="invalid_api_key")

    def _ready(self):
        info = self.gateway.info
        if info is None:
            state = self.gateway.state
            raise ApiError(503, f"The engine is not ready ({state}): {self.gateway.problem}.", type="server_error",
                           code="engine_" + state)
        return info

    def _check_model(self, wanted: str | None, info) -> str:
        mid = model_id(info)
        if wanted is None or wanted in (mid, Path(info.model_path).name, info.model_name):
            return mid
        raise ApiError(404, f"The model {shown(wanted)} does not exist here; this server runs '{mid}' "
                       "(GET /v1/models).", param="model", code="model_not_found")

    def _check_room(self) -> None:
        if self.in_flight >= self.max_queue:
            raise ApiError(429, f"The server is busy: {self.in_flight} requests are waiting or running (at most "
                           f"{self.max_queue}). Retry after the seconds in Retry-After.", type="requests",
                           code="queue_full")

    # ---- simple routes -----------------------------------------------------------------------------
    async def health(self, request: Request) -> JSONResponse:
        """No key needed (as in llama.cpp's server): 200 when the engine is ready, else 503 with why."""
        info = self.gateway.info
        body = {"status": "ok" if info else self.gateway.state, "in_flight": self.in_flight,
                "max_queue": self.max_queue, "body_room": self.body_room.as_dict(), "stats": dict(self.stats)}
        if info is not None:
            body["model"] = model_id(info)
        else:
            body["problem"] = self.gateway.problem
        document = getattr(self.gateway, "document", None)  # the prompt cache the /v1 requests share
        if document is not None:
            body["prompt_cache"] = {**document.as_dict(), "line": document.line()}
        return JSONResponse(body, status_code=200 if info else 503)

    async def models(self, request: Request) -> JSONResponse:
        self._check_key(request)
        info = self._ready()
        return JSONResponse({"object": "list", "data": [model_card(model_id(info), info)]})

    async def model(self, request: Request) -> JSONResponse:
        self._check_key(request)
        info = self._ready()
        return JSONResponse(model_card(self._check_model(request.path_params["model_id"], info), info))

    async def chat_completions(self, request: Request) -> Response:
        return await self._complete(request, chat=True)

    async def completions(self, request: Request) -> Response:
        return await self._complete(request, chat=False)

    # ---- completions -------------------------------------------------------------------------------
    def _ended(self, run: EngineRun) -> None:
        self.in_flight -= 1
        stopped = kind_of(run.end) == CANCELLED or (kind_of(run.end) == DONE
                                                    and run.end.result.finish_reason == "cancelled")
        if run.client_gone and stopped:
            self.stats["cancelled_client_gone"] += 1  # stopped early for a client that left: the engine is free

    async def _complete(self, request: Request, *, chat: bool) -> Response:
        self._check_key(request)
        check_content_type(request)
        info = self._ready()
        self._check_room()  # before the body is read: a full queue costs the client no upload
        p = await self._read(request, chat, info)
        mid = self._check_model(p.model, info)
        self._check_room()  # again: others may have been queued while this body arrived
        self.stats["requests"] += 1
        self.in_flight += 1
        run = EngineRun(self.gateway, TaskKind.COMPLETE, p.request, on_end=self._ended)
        watcher = asyncio.create_task(self._watch_disconnect(request, run))
        rid, created, t0 = new_id(chat), int(time.time()), time.perf_counter()
        try:
            first = await self._next(run, queued=True)
            if kind_of(first) == FAILED:
                raise await self._failure(first, p)
            if kind_of(first) == CANCELLED or run.client_gone:
                return Response(status_code=499)  # nobody is listening: the client closed the connection
            if p.stream:
                stream = self._stream(p, run, first, watcher, rid, mid, created, t0)
                watcher = None  # the stream owns it now
                return StreamingResponse(stream, media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            return await self._whole(p, run, first, rid, mid, created, t0)
        finally:
            if watcher is not None:
                watcher.cancel()
                run.cancel()  # a no-op once the task ended

    async def _read(self, request: Request, chat: bool, info) -> Parsed:
        """The request's body read and parsed within its room (BodyRoom): the JSON tree is gone when it ends."""
        async with self.body_room.hold(body_size(request)):
            return parse_request(await read_json(request), chat=chat, defaults=self.defaults, n_layer=info.n_layer,
                                 recommended=getattr(info, "sampling", ()))

    async def _next(self, run: EngineRun, *, queued: bool = False):
        """The run's next message; ApiError 503 (`queued`: its first, the engine has not started on it) or 504
        (silent while running) when none comes in time, the task cancelled. Its queue slot stays held until the
        engine ends the task, so a stuck engine fills the queue and later requests get 429 at once."""
        timeout = self.queue_timeout_s if queued else self.stall_timeout_s
        try:
            return await asyncio.wait_for(run.get(), timeout)
        except TimeoutError:
            run.cancel()
            if queued:
                raise ApiError(503, f"The engine did not start on this request within {timeout:.0f} s (it is busy "
                               "with earlier requests or stuck). Retry later.", type="server_error",
                               code="queue_timeout") from None
            raise ApiError(504, f"The engine sent nothing for {timeout:.0f} s while answering; the request was "
                           "stopped. Retry later.", type="server_error", code="engine_timeout") from None

    async def _watch_disconnect(self, request: Request, run: EngineRun) -> None:
        """Cancel the engine task when the client closes the connection (waiting, prefilling or decoding)."""
        while (await request.receive())["type"] != "http.disconnect":
            pass
        if run.end is None:
            run.client_gone = True
            log.info("client went away: cancelling engine task %s", run.ticket.id)
            run.cancel()

    async def _failure(self, msg: TaskFailed, p: Parsed) -> ApiError:
        """The engine refused or failed the request: the status and message a client should get."""
        if msg.error_type == "DocumentTooLongError":
            counting, extra = EngineRun(self.gateway, TaskKind.COUNT, CountRequest(p.request)), {}
            try:
                count = await asyncio.wait_for(counting.result(), self.stall_timeout_s)
            except TimeoutError:  # a stuck engine: the 400 goes out without its counts, as late as a 504 would
                counting.cancel()
                count = None
            if kind_of(count) == DONE and isinstance(count.result, CountResult):
                c = count.result
                extra = {"n_prompt_tokens": c.prompt_tokens, "n_ctx": c.n_ctx, "reserved_for_answer": c.reserve}
            return ApiError(400, msg.message, param="messages" if p.chat else "prompt",
                            code="context_length_exceeded", **extra)
        if msg.error_type in ("DocumentError", "EmptyDocumentError", "ValueError"):
            return ApiError(400, msg.message, code="invalid_value")
        if msg.error_type == "EngineError":  # the engine died or was stopped: unavailable for now, so 503 to retry
            self.stats["failed"] += 1
            return ApiError(503, msg.message, type="server_error", code="engine_crashed")
        self.stats["failed"] += 1
        return ApiError(500, msg.message, type="server_error", code=msg.error_type)

    async def _messages(self, run: EngineRun, msg):
        """The run's messages from `msg` (its first) on, its end (TaskDone, TaskFailed, TaskCancelled) last."""
        while True:
            yield msg
            if is_end(msg):
                return
            msg = await self._next(run)

    async def _whole(self, p: Parsed, run: EngineRun, msg, rid: str, mid: str, created: int, t0: float) -> Response:
        async for msg in self._messages(run, msg):
            kind = kind_of(msg)
            if kind == DONE:
                if run.client_gone:
                    return Response(status_code=499)
                self._answered(p, msg.result, t0)
                return JSONResponse(response(p, rid, mid, created, msg.result))
            if kind == FAILED:
                raise await self._failure(msg, p)
        return Response(status_code=499)  # TaskCancelled

    async def _stream(self, p: Parsed, run: EngineRun, msg, watcher: asyncio.Task, rid: str, mid: str,
                      created: int, t0: float):
        """Server-sent events: `data: {chunk}` per piece of text, the last chunk with the finish reason
        and `timings`, a usage chunk if asked for, then `data: [DONE]`."""
        def sse(obj) -> str:
            return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

        sent = ""  # the engine's pieces never hold part of a stop sequence (backend/stopping.py)
        try:
            if p.chat:
                yield sse(chunk(p, rid, mid, created, role=True))
            async for msg in self._messages(run, msg):
                kind = kind_of(msg)
                if kind == EVENT and isinstance(msg.event, TokenEvent) and msg.event.text:
                    sent += msg.event.text
                    yield sse(chunk(p, rid, mid, created, text=msg.event.text))
                elif kind == DONE:
                    result = msg.result
                    rest = result.text[len(sent):] if result.text.startswith(sent) else ""
                    if rest:
                        yield sse(chunk(p, rid, mid, created, text=rest))
                    yield sse(chunk(p, rid, mid, created, reason=finish_reason(result), result=result))
                    if p.include_usage:
                        yield sse(usage_chunk(p, rid, mid, created, result))
                    yield "data: [DONE]\n\n"
                    self._answered(p, result, t0)
                elif kind == FAILED:
                    yield sse((await self._failure(msg, p)).body)
        except ApiError as err:  # the engine went silent mid-answer: the status line has gone, so say it here
            self.stats[f"rejected_{err.status}"] += 1
            yield sse(err.body)
        finally:
            watcher.cancel()
            if run.end is None:  # the client went away mid-stream (the generator was closed): free the engine
                run.client_gone = True
                run.cancel()

    def _answered(self, p: Parsed, result, t0: float) -> None:
        """An answer went out whole: counted and logged."""
        self.stats["answered"] += 1
        t = result.timings
        log.info("%s answered in %.0f ms: %d+%d tokens (%d cached), mode %s, ttft %.0f ms%s",
                 "chat" if p.chat else "completion", (time.perf_counter() - t0) * 1000, result.prompt_tokens,
                 t.predicted_n, t.cache_n, t.mode, t.ttft_ms, f" ({t.note})" if t.note else "")
