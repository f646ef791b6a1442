"""The engine service: one child process owns the `backend.engine.Engine`; the GUI talks to it by queues.

Why a process: a llama context is not thread-safe, and a crash inside llama.cpp (or a bad pointer
write by the KV injection) must cost the user an engine restart, not the app or the chat.

The GUI side (`EngineService`, a QObject) puts `Task`s on a queue and polls the event queue with a
QTimer on the GUI thread, so every signal it emits is already on the GUI thread. Cancel is
cooperative: a shared integer holds the highest task id to stop; the engine checks it between
prefill chunks and between tokens. A dead child is noticed on the next poll: its pending tasks fail
with a clear message and a fresh engine starts with the same configuration.
"""
from __future__ import annotations

import itertools
import logging
import multiprocessing as mp
import queue
import signal
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal, Slot

log = logging.getLogger(__name__)

POLL_MS = 15
MAX_EVENTS_PER_POLL = 400  # keep the event loop responsive under a flood of token events
MAX_RESTARTS = 3  # within RESTART_WINDOW_S; more means the engine cannot run, so stop trying
RESTART_WINDOW_S = 60.0


# ---- what travels between the processes ----------------------------------------------------------
@dataclass
class EngineSettings:
    """How to build the engine (picklable; the child builds an EngineConfig from it)."""

    model_path: str
    n_ctx: int = 8192
    n_threads: int | None = None
    n_batch: int = 512
    warm_up: bool = True  # probe RidgeFill's graph layout when idle (tests that run exact skip it)


@dataclass
class Task:
    id: int
    kind: str  # complete | count | maps_status | fit_maps | recall | ping | crash_for_test
    payload: Any = None


@dataclass
class CountRequest:
    """Count the prompt tokens of a request and say whether it fits (before sending it)."""

    request: Any  # CompletionRequest


@dataclass
class CountResult:
    prompt_tokens: int
    n_ctx: int
    reserve: int
    fits: bool
    message: str = ""


@dataclass
class MapsStatusRequest:
    split: int


@dataclass
class MapsStatus:
    split: int
    status: str  # verified | warning | refused | missing | unavailable
    reasons: list[str] = field(default_factory=list)
    folder: str = ""


@dataclass
class FitMapsRequest:
    split: int


@dataclass
class RecallRequest:
    """Arguments for EVALS's needle-recall runner (built in the child, where the engine is)."""

    lengths: list[int]
    depths: list[float]
    modes: list[str]
    split: int | None
    tail: int | None
    document: str | None = None
    out_path: str | None = None
    extra: dict = field(default_factory=dict)


@dataclass
class EngineReady:
    pid: int
    model_path: str
    model_name: str
    architecture: str
    n_layer: int
    n_embd: int
    n_ctx: int
    n_ctx_train: int
    default_split: int
    default_tail: int
    min_tail: int
    min_bulk: int
    load_s: float

    def as_dict(self) -> dict:
        return asdict(self)


# ---- the child process ---------------------------------------------------------------------------
def _ridgefill_defaults(info) -> tuple[int, int, int, int]:
    """(split, tail, min_tail, min_bulk) from backend/ridgefill/defaults.py, or the reference values."""
    try:
        from backend.ridgefill import defaults

        return (int(defaults.default_split(info)), int(defaults.default_tail(info)),
                int(getattr(defaults, "MIN_TAIL", 512)), int(defaults.MIN_BULK))
    except Exception:  # module missing or broken: the method's reference values
        return max(1, info.n_layer // 2), 2048, 512, 1024


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
    try:
        from backend.ridgefill import maps as maps_mod
    except Exception as exc:  # MAPS's module not there yet
        return MapsStatus(req.split, "unavailable", [f"map support is not installed ({exc})"])
    model = engine.config.model_path
    try:
        found = maps_mod.find_maps(model, req.split)
    except Exception as exc:  # MapsMissing / MapsRefused carry the reason
        name = type(exc).__name__
        status = "refused" if "Refused" in name else "missing"
        return MapsStatus(req.split, status, [str(exc)])
    check = maps_mod.check_maps(found.folder, model)
    return MapsStatus(req.split, check.status, list(check.reasons), str(found.folder))


def _fit_maps(engine, req: FitMapsRequest, on_event, cancel):
    """Capture calibration activations once (cached), then fit this split's maps: both with progress."""
    from backend.protocol import ProgressEvent
    from backend.ridgefill.fitting import fit_map_set

    t0 = time.perf_counter()

    def progress(stage: str, done: int, total: int) -> None:
        on_event(ProgressEvent(int(done), int(total), (time.perf_counter() - t0) * 1000, stage))

    try:
        folder = fit_map_set(engine.config.model_path, req.split, on_progress=progress, cancel=cancel, engine=engine)
    finally:
        engine.truncate_cache(0)  # the capture used the context: the next chat must not reuse its rows
    return str(folder)


def _recall(engine, req: RecallRequest, on_event, cancel):
    from app.recall_task import run_recall_task

    return run_recall_task(engine, req, on_event, cancel)


def _ping(engine, payload, on_event, cancel):
    return "pong"


def _crash(engine, payload, on_event, cancel):  # used by tests: a hard crash, as a segfault would be
    import os

    os.kill(os.getpid(), signal.SIGKILL)


HANDLERS = {
    "complete": lambda e, p, ev, c: e.complete(p, on_event=ev, cancel=c),
    "count": _count,
    "maps_status": _maps_status,
    "fit_maps": _fit_maps,
    "recall": _recall,
    "ping": _ping,
    "crash_for_test": _crash,
}


def register_handler(kind: str, fn) -> None:
    """Add a task kind (the function runs in the child: it must be importable there)."""
    HANDLERS[kind] = fn


def _warm_up(engine) -> None:
    """While the user reads or attaches a document: RidgeFill's one-time graph-layout probe, so the
    first RidgeFill answer does not pay for it in its TTFT. Harmless if it fails (the request says why)."""
    try:
        from backend.ridgefill.injection import engine_state

        engine_state(engine)
    except Exception:  # noqa: BLE001
        logging.getLogger("engine").debug("RidgeFill warm-up failed", exc_info=True)
    finally:
        engine.truncate_cache(0)


def _child_main(settings: EngineSettings, tasks, events, cancel_id) -> None:
    """The engine process: build the engine, then serve tasks one at a time until None arrives."""
    import os

    from backend.engine import Engine, EngineConfig
    from backend.errors import Cancelled, RidgeFillError

    t0 = time.perf_counter()
    try:
        cfg = EngineConfig(model_path=settings.model_path, n_ctx=settings.n_ctx, n_batch=settings.n_batch,
                           n_ubatch=settings.n_batch)
        if settings.n_threads:
            cfg.n_threads = settings.n_threads
        engine = Engine(cfg)
    except RidgeFillError as exc:
        events.put(("fatal", 0, type(exc).__name__, str(exc)))
        return
    except Exception as exc:  # noqa: BLE001 - reported, the GUI decides
        events.put(("fatal", 0, type(exc).__name__, f"the engine could not start: {exc}"))
        return
    split, tail, min_tail, min_bulk = _ridgefill_defaults(engine.info)
    info = engine.info
    events.put(("ready", 0, EngineReady(os.getpid(), str(info.path), info.name, info.architecture, info.n_layer,
                                        info.n_embd, engine.n_ctx, info.n_ctx_train, split, tail, min_tail, min_bulk,
                                        time.perf_counter() - t0)))
    warmed = not settings.warm_up
    while True:
        try:
            task = tasks.get(timeout=0.5)
        except queue.Empty:
            if not warmed:
                warmed = True
                _warm_up(engine)
            continue
        if task is None:
            break
        tid = task.id

        def cancel(tid=tid) -> bool:
            return cancel_id.value >= tid

        def on_event(ev, tid=tid) -> None:
            events.put(("event", tid, ev))

        try:
            fn = HANDLERS.get(task.kind)
            if fn is None:
                raise RidgeFillError(f"unknown engine task {task.kind!r}")
            events.put(("result", tid, fn(engine, task.payload, on_event, cancel)))
        except Cancelled as exc:
            events.put(("cancelled", tid, str(exc)))
        except RidgeFillError as exc:
            events.put(("error", tid, type(exc).__name__, str(exc)))
        except Exception as exc:  # noqa: BLE001 - a bug in a handler must not kill the engine
            logging.getLogger("engine").exception("task %s failed", task.kind)
            events.put(("error", tid, type(exc).__name__, f"unexpected failure in {task.kind}: {exc}"))
    engine.close()


# ---- the GUI side ----------------------------------------------------------------------------------
class EngineService(QObject):
    """Owns the engine child process. All signals are emitted on the GUI thread.

    submit(kind, payload) -> task id; then event(id, ProgressEvent|TokenEvent|...), and exactly one of
    result(id, value), cancelled(id, message), failed(id, error_type, message).
    """

    ready = Signal(object)  # EngineReady
    event = Signal(int, object)
    result = Signal(int, object)
    cancelled = Signal(int, str)
    failed = Signal(int, str, str)
    crashed = Signal(str)  # the child died; a new one is starting
    fatal = Signal(str)  # the engine cannot start (bad model file, too many crashes)
    busy_changed = Signal(bool)

    def __init__(self, settings: EngineSettings, parent: QObject | None = None, *, auto_restart: bool = True):
        super().__init__(parent)
        self.settings = settings
        self.auto_restart = auto_restart
        self.info: EngineReady | None = None
        self._ctx = mp.get_context("spawn")
        self._ids = itertools.count(1)
        self._pending: dict[int, str] = {}
        self._proc = None
        self._tasks = None
        self._events = None
        self._cancel_id = None
        self._stopping = False
        self._crash_times: list[float] = []
        self._timer = QTimer(self)
        self._timer.setInterval(POLL_MS)
        self._timer.timeout.connect(self._poll)

    # -- lifetime --
    def start(self) -> None:
        self._stopping = False
        self.info = None
        self._tasks = self._ctx.Queue()
        self._events = self._ctx.Queue()
        self._cancel_id = self._ctx.Value("q", 0, lock=False)
        self._proc = self._ctx.Process(target=_child_main, name="ridgefill-engine", daemon=True,
                                       args=(self.settings, self._tasks, self._events, self._cancel_id))
        self._proc.start()
        log.info("engine process %s started for %s", self._proc.pid, self.settings.model_path)
        self._timer.start()

    def restart(self, settings: EngineSettings | None = None) -> None:
        """Stop the engine (pending tasks fail) and start it again, with new settings if given."""
        self.shutdown()
        self._fail_pending("EngineError", "the engine was restarted")
        if settings is not None:
            self.settings = settings
        self.start()

    def shutdown(self, timeout: float = 5.0) -> None:
        """Ask the child to finish, wait for it, then stop polling. Safe to call twice."""
        self._stopping = True
        self._timer.stop()
        proc = self._proc
        if proc is None:
            return
        if proc.is_alive():
            self.cancel()
            try:
                self._tasks.put(None)
            except (OSError, ValueError):
                pass
            proc.join(timeout)
            if proc.is_alive():
                proc.terminate()
                proc.join(2)
            if proc.is_alive():
                proc.kill()
                proc.join(2)
        for q in (self._tasks, self._events):
            q.cancel_join_thread()  # never block the GUI's exit on a queue's feeder thread
            q.close()
        self._proc = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def busy(self) -> bool:
        return bool(self._pending)

    def is_ready(self) -> bool:
        return self.info is not None and self._proc is not None and self._proc.is_alive()

    # -- tasks --
    def submit(self, kind: str, payload: Any = None) -> int:
        if self._proc is None:
            self.start()
        tid = next(self._ids)
        was_busy = self.busy
        self._pending[tid] = kind
        self._tasks.put(Task(tid, kind, payload))
        if not was_busy:
            self.busy_changed.emit(True)
        return tid

    def cancel(self, task_id: int | None = None) -> None:
        """Stop every task up to `task_id` (default: all submitted so far) at its next check.

        One shared counter: the child treats a task as cancelled when its id <= the counter, so a
        stop also empties the queue behind the running task, and a late stop never hits a newer task."""
        if task_id is None:
            if not self._pending:
                return
            task_id = max(self._pending)
        if self._cancel_id is not None and task_id > self._cancel_id.value:
            self._cancel_id.value = task_id

    # -- polling --
    @Slot()
    def _poll(self) -> None:
        n = 0
        while n < MAX_EVENTS_PER_POLL:
            try:
                msg = self._events.get_nowait()
            except queue.Empty:
                break
            except (OSError, ValueError, EOFError):
                break
            n += 1
            self._dispatch(msg)
        proc = self._proc
        if proc is not None and not proc.is_alive() and not self._stopping:
            self._drain()
            self._on_death(proc.exitcode)

    def _drain(self) -> None:
        while True:
            try:
                self._dispatch(self._events.get_nowait())
            except Exception:  # noqa: BLE001 - empty or broken: nothing more to read
                return

    def _dispatch(self, msg) -> None:
        kind, tid = msg[0], msg[1]
        if kind == "ready":
            self.info = msg[2]
            self.ready.emit(msg[2])
        elif kind == "fatal":
            self._stopping = True
            self._fail_pending(msg[2], msg[3])
            self.fatal.emit(msg[3])
        elif kind == "event":
            if tid in self._pending:
                self.event.emit(tid, msg[2])
        else:
            if self._pending.pop(tid, None) is None:
                return
            if kind == "result":
                self.result.emit(tid, msg[2])
            elif kind == "cancelled":
                self.cancelled.emit(tid, msg[2])
            elif kind == "error":
                self.failed.emit(tid, msg[2], msg[3])
            if not self._pending:
                self.busy_changed.emit(False)

    def _fail_pending(self, etype: str, message: str) -> None:
        pending, self._pending = self._pending, {}
        for tid in sorted(pending):
            self.failed.emit(tid, etype, message)
        if pending:
            self.busy_changed.emit(False)

    def _on_death(self, exitcode: int | None) -> None:
        how = f"exit code {exitcode}"
        if exitcode is not None and exitcode < 0:
            try:
                how = f"signal {signal.Signals(-exitcode).name}"
            except ValueError:
                how = f"signal {-exitcode}"
        message = f"The engine process stopped unexpectedly ({how})."
        log.error(message)
        self._stopping = True
        self._timer.stop()
        self._fail_pending("EngineError", message + " The answer in progress was lost; ask again.")
        for q in (self._tasks, self._events):
            q.cancel_join_thread()
            q.close()
        self._proc = None
        now = time.monotonic()
        self._crash_times = [t for t in self._crash_times if now - t < RESTART_WINDOW_S] + [now]
        if not self.auto_restart or len(self._crash_times) > MAX_RESTARTS:
            self.fatal.emit(message + " It crashed repeatedly, so it was not restarted; check the model "
                            "and settings, then restart it from the Engine menu.")
            return
        self.crashed.emit(message + " A new engine is starting; the conversation is kept.")
        self.start()
