"""The engine as the server sees it: tasks submitted from any thread, their messages handed to a callback.

`EngineProcess` is not thread-safe and must be driven from one thread, while the HTTP server runs on
an asyncio loop in another. `ProcessGateway` gives the EngineProcess a thread of its own (the pump):
`submit` and `cancel` only put commands on a queue that the pump carries out, in arrival order, so
tasks reach the engine child (which serves them one at a time, oldest first) in the order the
requests came. Each request's task is an app/task_stream.py Task, kept pending in the process's own
table; the pump polls the process, which calls the task's `deliver` with its TaskEvents and its one
TaskDone, TaskFailed or TaskCancelled, on the pump thread.

The GUI serves the engine it already has through a gateway of its own (ui/serve_switch.py) that
does the same on the Qt event loop; both have the shape of `EngineGateway`.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable, Protocol

from app.engine_messages import Receiver, TaskEnd, route
from app.engine_process import EngineProcess
from app.engine_protocol import (
    PAYLOAD_TYPES,
    EngineCrashed,
    EngineFatal,
    EngineReady,
    EngineSettings,
    EngineStarted,
    TaskEvent,
    TaskFailed,
    TaskKind,
)
from app.task_stream import Task
from backend.errors import EngineError

log = logging.getLogger(__name__)

Deliver = Callable[[Any], None]  # called with TaskEvent, then one TaskDone | TaskFailed | TaskCancelled

BUSY_POLL_S = 0.002  # while tasks run: the longest a token waits in the pump before it is handed on
IDLE_POLL_S = 0.05  # nothing pending: a submit wakes the pump at once anyway


class EngineGateway(Protocol):
    """What the server needs from an engine; every method may be called from any thread."""

    @property
    def info(self) -> EngineReady | None: ...  # None while loading or restarting

    @property
    def state(self) -> str: ...  # loading | ready | fatal | stopped

    @property
    def problem(self) -> str: ...  # why the engine is not ready, in words ("" when it is)

    @property
    def document(self) -> Any: ...  # the engine's prompt as saved and refined (backend/idle_work.py), or None

    def submit(self, kind: TaskKind, payload: Any, deliver: Deliver) -> Task: ...  # `deliver` listens to it

    def cancel(self, task: Task) -> None: ...


def check_payload(kind: TaskKind, payload: Any) -> TaskKind:
    """A wrong payload fails here, in the caller, not later on the pump or GUI thread."""
    kind = TaskKind(kind)
    want = PAYLOAD_TYPES[kind]
    if not isinstance(payload, want):
        raise TypeError(f"a {kind.value} task takes {want}, not {type(payload).__name__}")
    return kind


class ProcessGateway(Receiver):
    """An EngineProcess driven by a pump thread of its own (for `python -m app serve` and the tests)."""

    def __init__(self, settings: EngineSettings, *, auto_restart: bool = True):
        self.process = EngineProcess(settings, auto_restart=auto_restart)
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._info: EngineReady | None = None
        self._state = "loading"
        self._problem = "the model is loading"
        self._thread: threading.Thread | None = None
        self._closing = threading.Lock()  # the pump's last drain against a submit that comes with it
        self._closed = False  # the last drain is done: a submit fails at once

    # -- lifetime --
    def start(self) -> "ProcessGateway":
        """Start the engine child (here, so it inherits the caller's signal dispositions) and the pump,
        which drives the process from then on."""
        if self._thread is None:
            self.process.start()
            self._thread = threading.Thread(target=self._pump, name="ridgefill-gateway", daemon=True)
            self._thread.start()
        return self

    def wait_ready(self, timeout: float = 300.0) -> EngineReady:
        """Block until the model is loaded; EngineError if it cannot be (a bad model file) or in time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._ready.wait(0.1) and self._info is not None:
                return self._info
            if self._state in ("fatal", "stopped"):
                raise EngineError(self._problem)
        raise EngineError(f"the engine did not load its model within {timeout:.0f} s")

    def close(self, timeout: float = 10.0) -> None:
        """Stop the pump and the engine child (pending tasks fail). Safe to call twice."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    # -- what the server reads --
    @property
    def info(self) -> EngineReady | None:
        return self._info

    @property
    def state(self) -> str:
        return self._state

    @property
    def problem(self) -> str:
        return self._problem

    @property
    def document(self) -> Any:
        return self.process.document

    # -- tasks (any thread) --
    def submit(self, kind: TaskKind, payload: Any, deliver: Deliver) -> Task:
        task = Task(check_payload(kind, payload), payload, deliver)
        with self._closing:
            if not self._closed:  # else the pump's last drain is over: nothing would ever take it
                self._commands.put(("submit", task))
                self._wake.set()
                return task
        task.deliver(TaskFailed(0, "EngineError", "The server is stopping."))
        return task

    def cancel(self, task: Task) -> None:
        self._commands.put(("cancel", task))  # the pump cancels it: the process is driven from there only
        self._wake.set()

    # -- the pump thread --
    def _pump(self) -> None:
        try:
            while not self._stop.is_set():
                self._run_commands()
                self.process.poll(on_message=self._route)
                self._wake.wait(BUSY_POLL_S if self.process.busy else IDLE_POLL_S)
                self._wake.clear()
        except Exception:  # noqa: BLE001 - a bug here must not leave the server waiting forever
            log.exception("the engine gateway stopped")
            self._state, self._problem = "fatal", "the engine gateway stopped unexpectedly (see the log)"
        finally:
            self._stop.set()  # from here a submit fails at once, also after a bug stopped the pump
            self.process.shutdown(reason="the server was stopped")
            self.process.poll(on_message=self._route)  # delivers the pending tasks' failures
            with self._closing:  # submitted while stopping fail here; after this, in submit itself
                self._closed = True
                self._run_commands()
            if self._state != "fatal":
                self._state, self._problem = "stopped", "the server was stopped"
            self._info = None
            self._ready.set()

    def _run_commands(self) -> None:
        while True:
            try:
                what, task = self._commands.get_nowait()
            except queue.Empty:
                return
            if what == "cancel":
                task.cancel()  # after its submit (one queue, in order); an ended task is left as it is
            elif self._stop.is_set():
                task.deliver(TaskFailed(0, "EngineError", "The server is stopping."))
            else:
                self.process.submit_task(task)

    def _route(self, msg) -> None:
        route(msg, self)

    # -- app/engine_messages.Receiver: the process delivered each task's messages to its Task already --
    def task_event(self, msg: TaskEvent) -> None:
        pass

    def task_ended(self, msg: TaskEnd) -> None:
        pass

    def engine_started(self, msg: EngineStarted) -> None:
        self._info, self._state, self._problem = msg.ready, "ready", ""
        self._ready.set()

    def engine_crashed(self, msg: EngineCrashed) -> None:
        self._info, self._state, self._problem = None, "loading", msg.message
        self._ready.clear()

    def engine_fatal(self, msg: EngineFatal) -> None:
        self._info, self._state, self._problem = None, "fatal", msg.message
        self._ready.set()
