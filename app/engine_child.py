"""The engine child process: it owns the `backend.engine.Engine` and serves tasks one at a time.

`child_main` (the target EngineProcess starts, app/engine_process.py) builds the engine, then serves
each `TaskMessage` with the handler registered for its `TaskKind`, and answers with the typed messages
of app/engine_protocol.py. Cancel is per task: the parent puts `CancelTask(id)` on a second queue, which
the child reads whenever a handler asks "am I cancelled?" (between prefill chunks, tokens, recall items)
and before it starts a task. The child ends with its parent, whatever ends the parent (`_end_with_parent`).
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import os
import queue
import signal
import sys
import threading
import time
from typing import Any, Callable

from app.cancel_book import CancelBook
from app.engine_protocol import (
    CountRequest,
    CountResult,
    DocumentState,
    EngineFatal,
    EngineReady,
    EngineSettings,
    EngineStarted,
    FitMapsRequest,
    GetMapsRequest,
    MapsStatus,
    MapsStatusRequest,
    RecallRequest,
    StopEngine,
    TaskCancelled,
    TaskDone,
    TaskEvent,
    TaskFailed,
    TaskKind,
    TaskMessage,
    TuneRequest,
)

IDLE_WAIT_S = 0.5  # the child waits this long for a task before it warms up
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

Handler = Callable[[Any, Any, Callable[[Any], None], Callable[[], bool]], Any]  # (engine, payload, on_event, cancel)


# ---- one handler per task kind ----------------------------------------------------------------
def _complete(engine, req, on_event, cancel, *, prompt_cache=None):
    from backend.completion import complete

    return complete(engine, req, on_event=on_event, cancel=cancel, prompt_cache=prompt_cache)


def _cache_clear(engine, payload, on_event, cancel, *, prompt_cache=None) -> int:
    from backend.prompt_cache import PromptCache

    return (prompt_cache or PromptCache()).clear()


def _count(engine, req: CountRequest, on_event, cancel) -> CountResult:
    from backend.errors import DocumentTooLongError

    tokens = engine.prompt_tokens(req.framed())
    reserve = engine.answer_reserve(req.request.max_tokens)
    try:
        engine.check_fits(len(tokens), req.request.max_tokens)
        return CountResult(len(tokens), engine.n_ctx_max, reserve, True)
    except DocumentTooLongError as exc:
        from backend.hub.context_fit import with_advice

        return CountResult(len(tokens), engine.n_ctx_max, reserve, False, str(with_advice(exc)))


def _maps_status(engine, req: MapsStatusRequest, on_event, cancel) -> MapsStatus:
    from backend.ridgefill.maps import MapsMissing, MapsRefused
    from backend.ridgefill.runtime import runtime

    try:
        # the same verified maps the requests use: checked once per split until the folder changes
        found = runtime(engine).maps(req.split)
    except MapsRefused as exc:
        return MapsStatus(req.split, "refused", [str(exc)])
    except MapsMissing as exc:
        return MapsStatus(req.split, "missing", [str(exc)])
    return MapsStatus(req.split, "warning" if found.warnings else "verified", list(found.warnings), str(found.folder))


def _stage_events(on_event):
    """on_progress / on_note callbacks that send ProgressEvent and StageNote events."""
    from app.engine_protocol import StageNote
    from backend.protocol import ProgressEvent

    t0 = time.perf_counter()

    def progress(stage: str, done: int, total: int) -> None:
        on_event(ProgressEvent(int(done), int(total), (time.perf_counter() - t0) * 1000, stage))

    return progress, lambda text: on_event(StageNote(str(text)))


def _hub_settings(req):
    from pathlib import Path

    from backend.hub.settings import HubSettings

    kw = {"cache_root": Path(req.cache_root)} if getattr(req, "cache_root", None) else {}
    for name in ("endpoint", "token", "maps_owner"):
        if getattr(req, name, None):
            kw[name] = getattr(req, name)
    return HubSettings(offline=bool(getattr(req, "offline", False)), **kw)


def _fit_maps(engine, req: FitMapsRequest, on_event, cancel) -> str:
    """Fit this split's maps here (never download): Get maps told to fit."""
    from backend.hub.get_maps import get_maps

    progress, note = _stage_events(on_event)
    with engine.scratch():  # the capture used the context: the next chat must not reuse its rows
        res = get_maps(engine.config.model_path, req.split, download=False, refit=True, engine=engine,
                       on_progress=progress, on_note=note, cancel=cancel)
    return res.folder


def _get_maps(engine, req: GetMapsRequest, on_event, cancel):
    """Get maps (backend/hub/get_maps.py): cached, else the published set, else captured once (resumable)
    on this engine and fitted; progress and notes as events."""
    from backend.hub.get_maps import CaptureOptions, get_maps

    progress, note = _stage_events(on_event)
    with engine.scratch():
        return get_maps(engine.config.model_path, req.split, _hub_settings(req), engine=engine,
                        capture=CaptureOptions(max_tokens=req.capture_tokens, seq_tokens=req.capture_seq_tokens),
                        on_progress=progress, on_note=note, cancel=cancel)


def _tune(engine, req: TuneRequest, on_event, cancel):
    """Tune the split for this model (backend/tuning/tune.py) and record it; the defaults follow."""
    from app.engine_protocol import TuneDone
    from backend.tuning import tune
    from backend.hub.get_maps import CaptureOptions
    from backend.ridgefill.tuned import read_tuned, summary

    progress, note = _stage_events(on_event)
    with engine.scratch():
        res = tune.run_tune(engine, splits=req.splits, budget_s=req.budget_s, doc_tokens=req.doc_tokens,
                            per_doc=req.per_doc, documents=req.documents, needles=req.needles,
                            settings=_hub_settings(req), capture=CaptureOptions(max_tokens=req.capture_tokens),
                            on_progress=progress, on_note=note, cancel=cancel)
    return TuneDone(res.split, summary(read_tuned(engine.info)) or f"S = {res.split}: {res.chosen_by}", res.brief(),
                    res.record_path)


def _recall(engine, req: RecallRequest, on_event, cancel):
    from app.recall_task import run_recall_task

    return run_recall_task(engine, req, on_event, cancel)


def _ping(engine, payload, on_event, cancel) -> str:
    return "pong"


def _crash(engine, payload, on_event, cancel):  # used by tests: a hard crash, as a segfault would be
    os.kill(os.getpid(), getattr(signal, "SIGKILL", signal.SIGTERM))


HANDLERS: dict[TaskKind, Handler] = {
    TaskKind.COMPLETE: _complete,
    TaskKind.COUNT: _count,
    TaskKind.MAPS_STATUS: _maps_status,
    TaskKind.FIT_MAPS: _fit_maps,
    TaskKind.GET_MAPS: _get_maps,
    TaskKind.TUNE: _tune,
    TaskKind.RECALL: _recall,
    TaskKind.CACHE_CLEAR: _cache_clear,
    TaskKind.PING: _ping,
    TaskKind.CRASH_FOR_TEST: _crash,
}
# Tasks that leave sequence 0 as it was: the idle work (save, refine) on what it holds goes on after them.
KEEPS_THE_DOCUMENT = {TaskKind.COUNT, TaskKind.MAPS_STATUS, TaskKind.CACHE_CLEAR, TaskKind.PING}
STATUS_EVERY_S = 0.5  # the document's state (tokens, share exact) is sent at most this often while refining


def _ready(engine, load_s: float) -> EngineReady:
    from backend.ridgefill import defaults
    from backend.ridgefill.tuned import read_tuned, summary

    info = engine.info
    return EngineReady(os.getpid(), str(info.path), info.name, info.architecture, info.n_layer, info.n_embd,
                       engine.n_ctx_max, info.n_ctx_train, int(defaults.default_split(info)),
                       int(defaults.default_tail(info)), int(defaults.MIN_TAIL), int(defaults.MIN_BULK), load_s,
                       summary(read_tuned(info)), sampling=info.sampling, default_mode=defaults.default_mode(info))


def _warm_up(engine) -> None:
    """While the user reads or attaches a document: RidgeFill's one-time set-up (graph-layout probe,
    K/V weights, the default split's maps), so the first RidgeFill answer does not pay for it in its
    TTFT. Harmless if it fails (the request that needs it says why)."""
    try:
        from backend.ridgefill.runtime import warm_up

        with engine.scratch():
            warm_up(engine)
    except Exception:  # noqa: BLE001
        logging.getLogger("engine").debug("RidgeFill warm-up failed", exc_info=True)


def _run_task(engine, task: TaskMessage, events, book: CancelBook, handlers=HANDLERS) -> tuple[bool, Any]:
    """Serve one task; (True, its result) when it ended in TaskDone, else (False, None)."""
    from backend.errors import Cancelled, RidgeFillError

    tid = task.id
    book.starting(tid)
    if book.is_cancelled(tid):
        events.put(TaskCancelled(tid, "cancelled before it started"))
        return False, None

    yields = getattr(task.payload, "yields", False)  # a background task (the tune started by itself)

    def cancel() -> bool:
        return book.is_cancelled(tid) or (yields and book.busy())

    def on_event(ev) -> None:
        events.put(TaskEvent(tid, ev))

    try:
        result = handlers[task.kind](engine, task.payload, on_event, cancel)
        events.put(TaskDone(tid, result))
        return True, result
    except Cancelled as exc:
        events.put(TaskCancelled(tid, str(exc)))
    except RidgeFillError as exc:
        events.put(TaskFailed(tid, type(exc).__name__, str(exc)))
    except Exception as exc:  # noqa: BLE001 - a bug in a handler must not kill the engine
        logging.getLogger("engine").exception("task %s failed", task.kind.value)
        events.put(TaskFailed(tid, type(exc).__name__, f"unexpected failure in {task.kind.value}: {exc}"))
    return False, None


def _framed(task: TaskMessage, events) -> TaskMessage | None:
    """A completion whose documents came apart from its turns, with them framed in: here, so the GUI thread
    never copies their text; None, the task failed, when they cannot be (an empty document)."""
    if not getattr(task.payload, "unframed_documents", None):
        return task
    from backend.documents import framed
    from backend.errors import RidgeFillError

    try:
        return TaskMessage(task.id, task.kind, framed(task.payload))
    except RidgeFillError as exc:
        events.put(TaskFailed(task.id, type(exc).__name__, str(exc)))
        return None


class _IdleLoop:
    """The child's idle work (backend/idle_work.py) between tasks, and the document's state sent to the
    parent as it goes (DocumentState)."""

    def __init__(self, engine, settings: EngineSettings, events):
        from functools import partial

        from backend.idle_work import IdleWork
        from backend.prompt_cache import PromptCache

        cache = PromptCache(limit_bytes=settings.cache_limit_bytes) if settings.prompt_cache else None
        self.work = IdleWork(engine, cache, refine=settings.refine)
        self.cache = cache
        self.handlers = {**HANDLERS, TaskKind.COMPLETE: self._complete,
                         TaskKind.CACHE_CLEAR: partial(_cache_clear, prompt_cache=cache)}
        self.events = events
        self._sent_at = 0.0

    def _complete(self, engine, req, on_event, cancel):
        """An answer; one that asked to wait for its check (the server's ridgefill.check) comes back after
        the idle work has made the document exact and checked it, with the verdict."""
        from backend.protocol import ProgressEvent

        result = _complete(engine, req, on_event, cancel, prompt_cache=self.cache)
        if req.wait_check and result.timings.bulk_n > 0 and result.finish_reason != "cancelled":
            self.work.after_completion(req, result)
            t0 = time.perf_counter()
            while not cancel() and self.work.step(should_stop=cancel):  # a chunk of refinement a step
                rows = engine.slot.record  # progress, so that a waiting server never takes the silence for a stall
                on_event(ProgressEvent(rows.n_clean, len(rows), (time.perf_counter() - t0) * 1000, stage="check"))
            check = self.work.last_check
            result.check = check.as_dict() if check is not None else {
                "verdict": "unavailable", "why": self.work.status().note or "the check was stopped before its end"}
        return result

    def after(self, task: TaskMessage, ended: tuple[bool, Any]) -> None:
        done, result = ended
        if task.kind == TaskKind.COMPLETE and done:
            if getattr(result, "check", None) is None:  # a checked answer's work is done already
                self.work.after_completion(task.payload, result)
        elif task.kind not in KEEPS_THE_DOCUMENT:
            self.work.forget()  # the context was used otherwise, or the prefill stopped midway
        if task.kind in (TaskKind.COMPLETE, TaskKind.CACHE_CLEAR):
            self.send_status()

    def step(self, tasks) -> None:
        """One piece of idle work; a waiting task stops a save between its pieces."""
        try:
            self.work.step(should_stop=lambda: not tasks.empty())
        except Exception:  # noqa: BLE001 - a bug in the idle work must not kill the engine
            logging.getLogger("engine").exception("idle work failed")
            self.work.forget()
            self.work.engine.slot.truncate(0)  # rows half made exact must not be reused
        if not self.work.pending or time.monotonic() - self._sent_at >= STATUS_EVERY_S:
            self.send_status()

    def send_status(self) -> None:
        self._sent_at = time.monotonic()
        self.events.put(DocumentState(self.work.status()))


def _end_with_parent() -> None:
    """However the app that started this child ends (SIGTERM, SIGKILL, a crash, the OOM killer), the child
    ends too: nobody else can use it, and it holds the model's memory. Its resource tracker then goes as
    well, since the child held the last open end of the tracker's pipe.

    A thread waits on multiprocessing's parent sentinel (POSIX: a pipe only the parent holds open, at EOF
    once it is gone, also if it died before this line; Windows: the parent's process handle) and exits.
    On Linux the kernel also sends SIGKILL when the parent's thread that started this child ends
    (PR_SET_PDEATHSIG): that also ends a child too busy in native code to run the thread."""
    parent = mp.parent_process()
    if parent is None:
        return
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):  # no prctl here: the thread below is enough
            pass

    def watch() -> None:
        from multiprocessing.connection import wait

        wait([parent.sentinel])
        os._exit(1)  # at once: the engine in use on the main thread cannot be closed from here

    threading.Thread(target=watch, name="ridgefill-parent-watch", daemon=True).start()


def child_main(settings: EngineSettings, tasks, events, cancels) -> None:
    """The engine process: build the engine, then serve tasks one at a time until StopEngine arrives."""
    from backend import user_paths
    from backend.engine import Engine, EngineConfig
    from backend.errors import RidgeFillError
    from backend.ridgefill.runtime import attach

    _end_with_parent()
    user_paths.use_cache_root(settings.cache_root)
    t0 = time.perf_counter()
    try:
        cfg = EngineConfig(model_path=settings.model_path, n_ctx=settings.n_ctx, n_batch=settings.n_batch,
                           n_ubatch=settings.n_batch)
        if settings.n_threads:
            cfg.n_threads = settings.n_threads
        engine = Engine(cfg)
        attach(engine)  # built whole: RidgeFill's runtime made with the context, so no planning decodes
    except RidgeFillError as exc:
        events.put(EngineFatal(type(exc).__name__, str(exc)))
        return
    except Exception as exc:  # noqa: BLE001 - reported; the parent decides
        events.put(EngineFatal(type(exc).__name__, f"the engine could not start: {exc}"))
        return
    events.put(EngineStarted(_ready(engine, time.perf_counter() - t0)))
    book = CancelBook(cancels, busy=lambda: not tasks.empty() or idle.work.pending)
    idle = _IdleLoop(engine, settings, events)
    warmed = not settings.warm_up
    while True:
        try:
            task = tasks.get_nowait() if warmed and idle.work.pending else tasks.get(timeout=IDLE_WAIT_S)
        except queue.Empty:
            if not warmed:
                warmed = True
                if not idle.work.pending:  # the warm-up clears the context: never under a held document
                    _warm_up(engine)
            elif idle.work.pending:
                idle.step(tasks)
            continue
        if isinstance(task, StopEngine):
            break
        task = _framed(task, events)
        if task is not None:
            idle.after(task, _run_task(engine, task, events, book, idle.handlers))
    engine.close()
