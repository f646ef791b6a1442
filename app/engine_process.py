"""The engine process: one child owns the `backend.engine.Engine`; a Qt-free handle drives it by queues.

Why a process: a llama context is not thread-safe, and a crash inside llama.cpp (or a bad pointer write
by the KV injection) must cost the user an engine restart, not the app or the chat.

The child (`child_main`) serves `TaskMessage`s one at a time with the handler registered for their
`TaskKind`, and answers with the typed messages of app/engine_protocol.py. Cancel is per task: the
parent puts `CancelTask(id)` on a second queue, which the child reads whenever a handler asks "am I
cancelled?" (between prefill chunks, tokens, recall items) and before it starts a task.

The parent side (`EngineProcess`) has no Qt: `submit` returns a task id, `poll` returns the messages
that arrived (never blocking), and a dead child is noticed by `poll`: its tasks fail with a clear
message and a fresh child starts with the same settings. The GUI wraps it in app/engine_client.py;
a local server can drive it directly.
"""
from __future__ import annotations

import itertools
import logging
import multiprocessing as mp
import os
import queue
import signal
import time
from typing import Any, Callable

from app.engine_protocol import (
    PAYLOAD_TYPES,
    CancelTask,
    CountRequest,
    CountResult,
    EngineCrashed,
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

log = logging.getLogger(__name__)

MAX_MESSAGES_PER_POLL = 400  # a caller on an event loop stays responsive under a flood of token events
MAX_RESTARTS = 3  # within RESTART_WINDOW_S; more means the engine cannot run, so stop trying
RESTART_WINDOW_S = 60.0
IDLE_WAIT_S = 0.5  # the child waits this long for a task before it warms up

Handler = Callable[[Any, Any, Callable[[Any], None], Callable[[], bool]], Any]  # (engine, payload, on_event, cancel)


# ---- the child: one handler per task kind --------------------------------------------------------
def _complete(engine, req, on_event, cancel):
    from backend.completion import complete

    return complete(engine, req, on_event=on_event, cancel=cancel)


def _count(engine, req: CountRequest, on_event, cancel) -> CountResult:
    from backend.errors import DocumentTooLongError

    tokens = engine.prompt_tokens(req.request)
    reserve = max(1, min(req.request.max_tokens, engine.n_ctx // 2))
    try:
        engine.check_fits(len(tokens), req.request.max_tokens)
        return CountResult(len(tokens), engine.n_ctx, reserve, True)
    except DocumentTooLongError as exc:
        return CountResult(len(tokens), engine.n_ctx, reserve, False, str(exc))


def _maps_status(engine, req: MapsStatusRequest, on_event, cancel) -> MapsStatus:
    from backend.ridgefill.maps import MapsMissing, MapsRefused
    from backend.ridgefill.setup import ridgefill_setup

    try:
        # the same verified maps the requests use: checked once per split until the folder changes
        found = ridgefill_setup(engine).maps(req.split)
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
    try:
        res = get_maps(engine.config.model_path, req.split, download=False, refit=True, engine=engine,
                       on_progress=progress, on_note=note, cancel=cancel)
    finally:
        engine.truncate_cache(0)  # the capture used the context: the next chat must not reuse its rows
    return res.folder


def _get_maps(engine, req: GetMapsRequest, on_event, cancel):
    """Get maps (backend/hub/get_maps.py): cached, else the published set, else captured once (resumable)
    on this engine and fitted; progress and notes as events."""
    from backend.hub.get_maps import CaptureOptions, get_maps

    progress, note = _stage_events(on_event)
    try:
        return get_maps(engine.config.model_path, req.split, _hub_settings(req), engine=engine,
                        capture=CaptureOptions(max_tokens=req.capture_tokens, seq_tokens=req.capture_seq_tokens),
                        on_progress=progress, on_note=note, cancel=cancel)
    finally:
        engine.truncate_cache(0)


def _tune(engine, req: TuneRequest, on_event, cancel):
    """Tune the split for this model (backend/evals/tune.py) and record it; the defaults follow."""
    from app.engine_protocol import TuneDone
    from backend.evals import tune
    from backend.hub.get_maps import CaptureOptions
    from backend.ridgefill.tuned import read_tuned, summary

    progress, note = _stage_events(on_event)
    kw = {k: v for k, v in {"length": req.length, "ttft_length": req.ttft_length, "depths": req.depths,
                            "variants": req.variants}.items() if v is not None}
    try:
        res = tune.run_tune(engine, splits=req.splits, budget_s=req.budget_s, settings=_hub_settings(req),
                            capture=CaptureOptions(max_tokens=req.capture_tokens), on_progress=progress,
                            on_note=note, cancel=cancel, **kw)
    finally:
        engine.truncate_cache(0)
    brief = {**res.brief(), "chosen_by": res.chosen_by}
    return TuneDone(res.split, summary(read_tuned(engine.info)) or f"S = {res.split}: {res.chosen_by}", brief,
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
    TaskKind.PING: _ping,
    TaskKind.CRASH_FOR_TEST: _crash,
}


class _CancelBook:
    """The child's view of the cancel queue: the ids asked to stop, read only when a handler checks."""

    def __init__(self, cancels):
        self._queue = cancels
        self._ids: set[int] = set()

    def is_cancelled(self, task_id: int) -> bool:
        while True:
            try:
                msg = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(msg, CancelTask):
                self._ids.add(msg.id)
        return task_id in self._ids

    def starting(self, task_id: int) -> None:
        """Tasks run in id order: a cancel for an older id came too late to matter."""
        self._ids = {i for i in self._ids if i >= task_id}


def _ready(engine, load_s: float) -> EngineReady:
    from backend.ridgefill import defaults
    from backend.ridgefill.tuned import read_tuned, summary

    info = engine.info
    return EngineReady(os.getpid(), str(info.path), info.name, info.architecture, info.n_layer, info.n_embd,
                       engine.n_ctx, info.n_ctx_train, int(defaults.default_split(info)),
                       int(defaults.default_tail(info)), int(defaults.MIN_TAIL), int(defaults.MIN_BULK), load_s,
                       summary(read_tuned(info)), sampling=info.sampling)


def _warm_up(engine) -> None:
    """While the user reads or attaches a document: RidgeFill's one-time set-up (graph-layout probe,
    K/V weights, the default split's maps), so the first RidgeFill answer does not pay for it in its
    TTFT. Harmless if it fails (the request that needs it says why)."""
    try:
        from backend.ridgefill.setup import warm_up

        warm_up(engine)
    except Exception:  # noqa: BLE001
        logging.getLogger("engine").debug("RidgeFill warm-up failed", exc_info=True)
    finally:
        engine.truncate_cache(0)


def _run_task(engine, task: TaskMessage, events, book: _CancelBook) -> None:
    from backend.errors import Cancelled, RidgeFillError

    tid = task.id
    book.starting(tid)
    if book.is_cancelled(tid):
        events.put(TaskCancelled(tid, "cancelled before it started"))
        return

    def cancel() -> bool:
        return book.is_cancelled(tid)

    def on_event(ev) -> None:
        events.put(TaskEvent(tid, ev))

    try:
        events.put(TaskDone(tid, HANDLERS[task.kind](engine, task.payload, on_event, cancel)))
    except Cancelled as exc:
        events.put(TaskCancelled(tid, str(exc)))
    except RidgeFillError as exc:
        events.put(TaskFailed(tid, type(exc).__name__, str(exc)))
    except Exception as exc:  # noqa: BLE001 - a bug in a handler must not kill the engine
        logging.getLogger("engine").exception("task %s failed", task.kind.value)
        events.put(TaskFailed(tid, type(exc).__name__, f"unexpected failure in {task.kind.value}: {exc}"))


def child_main(settings: EngineSettings, tasks, events, cancels) -> None:
    """The engine process: build the engine, then serve tasks one at a time until StopEngine arrives."""
    from backend.engine import Engine, EngineConfig
    from backend.errors import RidgeFillError

    t0 = time.perf_counter()
    try:
        cfg = EngineConfig(model_path=settings.model_path, n_ctx=settings.n_ctx, n_batch=settings.n_batch,
                           n_ubatch=settings.n_batch)
        if settings.n_threads:
            cfg.n_threads = settings.n_threads
        engine = Engine(cfg)
    except RidgeFillError as exc:
        events.put(EngineFatal(type(exc).__name__, str(exc)))
        return
    except Exception as exc:  # noqa: BLE001 - reported; the parent decides
        events.put(EngineFatal(type(exc).__name__, f"the engine could not start: {exc}"))
        return
    events.put(EngineStarted(_ready(engine, time.perf_counter() - t0)))
    book = _CancelBook(cancels)
    warmed = not settings.warm_up
    while True:
        try:
            task = tasks.get(timeout=IDLE_WAIT_S)
        except queue.Empty:
            if not warmed:
                warmed = True
                _warm_up(engine)
            continue
        if isinstance(task, StopEngine):
            break
        _run_task(engine, task, events, book)
    engine.close()


# ---- the parent side -----------------------------------------------------------------------------
class EngineProcess:
    """Owns the engine child process; no Qt. Not thread-safe: drive it from one thread.

    submit(kind, payload) -> task id; poll() -> the typed messages that arrived since the last poll
    (app/engine_protocol.py). Every submitted task ends in exactly one TaskDone, TaskFailed or
    TaskCancelled, also when the child dies (TaskFailed, then EngineCrashed and a restart with the same
    settings) or is restarted or shut down (TaskFailed).
    """

    def __init__(self, settings: EngineSettings, *, auto_restart: bool = True):
        self.settings = settings
        self.auto_restart = auto_restart
        self.info: EngineReady | None = None
        self.pending: dict[int, TaskKind] = {}
        self._ctx = mp.get_context("spawn")
        self._ids = itertools.count(1)  # never reset: a late message from an old child matches no task
        self._proc = None
        self._tasks = self._events = self._cancels = None
        self._outbox: list = []  # messages made here (a death, a restart), returned by the next poll
        self._state = "new"  # new | running | fatal | shut
        self._fatal: EngineFatal | None = None
        self._crash_times: list[float] = []

    # -- lifetime --
    def start(self) -> None:
        """Start the child (a no-op while one runs); EngineStarted or EngineFatal follows."""
        if self._state == "running":
            return
        self._state = "running"
        self._fatal = None
        self.info = None
        self._tasks, self._events, self._cancels = self._ctx.Queue(), self._ctx.Queue(), self._ctx.Queue()
        self._proc = self._ctx.Process(target=child_main, name="ridgefill-engine", daemon=True,
                                       args=(self.settings, self._tasks, self._events, self._cancels))
        self._proc.start()
        log.info("engine process %s started for %s", self._proc.pid, self.settings.model_path)

    def restart(self, settings: EngineSettings | None = None) -> None:
        """Stop the child (its tasks fail) and start a new one, with new settings if given."""
        self.shutdown(reason="the engine was restarted")
        if settings is not None:
            self.settings = settings
        self._crash_times.clear()
        self.start()

    def shutdown(self, timeout: float = 5.0, *, reason: str = "the engine was shut down") -> None:
        """Ask the child to finish, wait for it (then terminate, then kill). Tasks still pending fail
        with `reason`. Safe to call twice."""
        proc = self._proc
        self._state = "shut"
        self.info = None
        if proc is not None:
            if proc.is_alive():
                for tid in self.pending:
                    self._put(self._cancels, CancelTask(tid))
                self._put(self._tasks, StopEngine())
                proc.join(timeout)
                if proc.is_alive():
                    proc.terminate()
                    proc.join(2)
                if proc.is_alive():
                    proc.kill()
                    proc.join(2)
            self._close_queues()
            self._proc = None
        self._fail_pending("EngineError", reason[:1].upper() + reason[1:] + ".")

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def busy(self) -> bool:
        return bool(self.pending)

    @property
    def running(self) -> bool:
        """A child is started (loading or ready); False when new, shut down or fatal."""
        return self._state == "running"

    # -- tasks --
    def submit(self, kind: TaskKind, payload: Any = None) -> int:
        """Queue a task (starting the child if it was never started); returns its id."""
        kind = TaskKind(kind)
        want = PAYLOAD_TYPES[kind]
        if not isinstance(payload, want):
            raise TypeError(f"a {kind.value} task takes {want}, not {type(payload).__name__}")
        if self._state == "new":
            self.start()
        tid = next(self._ids)
        if self._state != "running":
            why = self._fatal.message if self._fatal else "the engine is shut down"
            self._outbox.append(TaskFailed(tid, "EngineError", f"The engine is not running: {why}"))
            return tid
        self.pending[tid] = kind
        self._tasks.put(TaskMessage(tid, kind, payload))
        return tid

    def cancel(self, task_id: int) -> None:
        """Stop this task at its next check (or before it starts); other tasks are not touched."""
        if task_id in self.pending and self._cancels is not None:
            self._put(self._cancels, CancelTask(task_id))

    # -- messages --
    def poll(self, max_messages: int = MAX_MESSAGES_PER_POLL) -> list:
        """The messages that arrived, in order (never blocks). Notices a dead child and restarts it."""
        out, self._outbox = self._outbox, []
        while len(out) < max_messages and self._events is not None:
            try:
                msg = self._events.get_nowait()
            except (queue.Empty, OSError, ValueError, EOFError):
                break
            out.extend(self._accept(msg))
        proc = self._proc
        if proc is not None and self._state == "running" and not proc.is_alive():
            out.extend(self._drain())
            self._on_death(proc.exitcode)
            out.extend(self._outbox)
            self._outbox = []
        return out

    def _accept(self, msg) -> list:
        """Bookkeeping for one message from the child; returns what the caller should see."""
        if isinstance(msg, EngineStarted):
            self.info = msg.ready
            return [msg]
        if isinstance(msg, EngineFatal):
            self._state = "fatal"  # the child exits by itself; that is not a crash to restart from
            self._fatal = msg
            self._fail_pending(msg.error_type, msg.message)
            fails, self._outbox = self._outbox, []
            return fails + [msg]
        if isinstance(msg, TaskEvent):
            return [msg] if msg.id in self.pending else []
        if isinstance(msg, (TaskDone, TaskFailed, TaskCancelled)):
            return [msg] if self.pending.pop(msg.id, None) is not None else []
        log.warning("unknown message from the engine process: %r", msg)
        return []

    def _drain(self) -> list:
        out = []
        while True:
            try:
                msg = self._events.get_nowait()
            except Exception:  # noqa: BLE001 - empty or broken: nothing more to read
                return out
            out.extend(self._accept(msg))

    def _fail_pending(self, error_type: str, message: str) -> None:
        pending, self.pending = self.pending, {}
        self._outbox.extend(TaskFailed(tid, error_type, message) for tid in sorted(pending))

    def _on_death(self, exitcode: int | None) -> None:
        how = f"exit code {exitcode}"
        if exitcode is not None and exitcode < 0:
            try:
                how = f"signal {signal.Signals(-exitcode).name}"
            except ValueError:
                how = f"signal {-exitcode}"
        message = f"The engine process stopped unexpectedly ({how})."
        log.error(message)
        self._fail_pending("EngineError", message + " The answer in progress was lost; ask again.")
        self._close_queues()
        self._proc = None
        self.info = None
        now = time.monotonic()
        self._crash_times = [t for t in self._crash_times if now - t < RESTART_WINDOW_S] + [now]
        if not self.auto_restart or len(self._crash_times) > MAX_RESTARTS:
            self._state = "fatal"
            self._fatal = EngineFatal("EngineError", message + " It crashed repeatedly, so it was not restarted; "
                                      "check the model and settings, then restart it from the Engine menu.")
            self._outbox.append(self._fatal)
            return
        self._outbox.append(EngineCrashed(message + " A new engine is starting; the conversation is kept."))
        self._state = "new"
        self.start()

    # -- queues --
    @staticmethod
    def _put(q, msg) -> None:
        try:
            q.put(msg)
        except (OSError, ValueError):  # closed: the child is gone anyway
            pass

    def _close_queues(self) -> None:
        for q in (self._tasks, self._events, self._cancels):
            if q is not None:
                q.cancel_join_thread()  # never block the caller's exit on a queue's feeder thread
                q.close()
        self._tasks = self._events = self._cancels = None
