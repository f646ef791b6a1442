"""The GUI's side of background work: each task's events reach the one who submitted it, on the GUI thread.

A `TaskClient` wraps a Qt-free task source (the engine process of app/engine_process.py, or the thread
job runner of app/job_runner.py): `submit(kind, payload, on_event=..., on_done=..., on_failed=...,
on_cancelled=...)` returns a `TaskHandle` whose `cancel()` stops that task and no other (Anki's
QueryOp: every operation has its own success, failure and progress handlers). A QTimer polls the
source on the GUI thread, so every callback runs there. A task submitted with `owner=widget` is
cancelled, and its callbacks dropped, once that widget is deleted.

`EngineClient` adds what concerns the engine as a whole: the signals ready, crashed, fatal and
busy_changed, and start / restart / shutdown.
"""
from __future__ import annotations

import logging
import sys
from typing import Any, Callable

import shiboken6
from PySide6.QtCore import QObject, QTimer, Signal, Slot

from app import engine_messages as messages
from app.engine_messages import Receiver, TaskEnd, kind_of, route
from app.engine_process import EngineProcess
from app.engine_protocol import (
    DocumentState,
    EngineCrashed,
    EngineFatal,
    EngineReady,
    EngineSettings,
    EngineStarted,
    TaskEvent,
)

log = logging.getLogger(__name__)

POLL_MS = 15

PENDING, DONE, FAILED, CANCELLED = "pending", "done", "failed", "cancelled"


class TaskHandle:
    """One submitted task as its submitter sees it: its id, its state, its callbacks, `cancel()`.

    Callbacks: on_event(event) any number of times, then exactly one of on_done(result),
    on_failed(error_type, message) or on_cancelled(message). The state changes before they run.
    """

    def __init__(self, client: "TaskClient", task_id: int, kind: Any, owner: QObject | None = None):
        self.id = task_id
        self.kind = kind
        self.owner = owner
        self.state = PENDING
        self.result: Any = None
        self.error: tuple[str, str] | None = None  # (error_type, message) of a failed or cancelled task
        self._client = client
        self._callbacks: dict[str, list[Callable]] = {"event": [], "done": [], "failed": [], "cancelled": [],
                                                      "message": []}

    def connect(self, *, on_event: Callable[[Any], None] | None = None, on_done: Callable[[Any], None] | None = None,
                on_failed: Callable[[str, str], None] | None = None,
                on_cancelled: Callable[[str], None] | None = None,
                on_message: Callable[[Any], None] | None = None) -> "TaskHandle":
        """Add callbacks (after those given to submit). `on_message` gets the task's messages as they came
        (TaskEvent, then TaskDone, TaskFailed or TaskCancelled), after the state changed."""
        for name, fn in (("event", on_event), ("done", on_done), ("failed", on_failed), ("cancelled", on_cancelled),
                         ("message", on_message)):
            if fn is not None:
                self._callbacks[name].append(fn)
        return self

    def cancel(self) -> None:
        """Stop this task at its next check; a task that already ended is left as it is."""
        if self.state == PENDING:
            self._client.cancel(self.id)

    def running(self) -> bool:
        return self.state == PENDING

    def __repr__(self) -> str:
        kind = getattr(self.kind, "value", self.kind)
        return f"<TaskHandle {self.id} {kind} {self.state}>"

    # -- called by the client --
    def _owner_gone(self) -> bool:
        return self.owner is not None and not shiboken6.isValid(self.owner)

    def _call(self, name: str, *args) -> None:
        if self._owner_gone():
            return
        for fn in list(self._callbacks[name]):
            try:
                fn(*args)
            except Exception:  # noqa: BLE001 - one bad callback must not lose the other messages
                sys.excepthook(*sys.exc_info())

    def _deliver(self, msg: TaskEvent) -> None:
        self._call("event", msg.event)
        self._call("message", msg)

    def _finish(self, msg) -> None:
        kind = kind_of(msg)
        if kind == messages.DONE:
            self.state, self.result = DONE, msg.result
            self._call("done", msg.result)
        elif kind == messages.FAILED:
            self.state, self.error = FAILED, (msg.error_type, msg.message)
            self._call("failed", msg.error_type, msg.message)
        else:
            self.state, self.error = CANCELLED, ("Cancelled", msg.message)
            self._call("cancelled", msg.message)
        self._call("message", msg)
        self._callbacks = {k: [] for k in self._callbacks}  # nothing more will come; free the closures


class TaskClient(QObject, Receiver):
    """Delivers a task source's messages to the handles of the tasks they belong to (GUI thread).

    The source has submit(kind, payload) -> id, cancel(id) and poll() -> messages (TaskEvent,
    TaskDone, TaskFailed, TaskCancelled, and the engine's own: app/engine_messages.route calls this client's
    method for each kind).
    """

    busy_changed = Signal(bool)  # some task of this client is pending / none is

    def __init__(self, source, parent: QObject | None = None, *, poll_ms: int = POLL_MS):
        super().__init__(parent)
        self.source = source
        self._handles: dict[int, TaskHandle] = {}
        self._timer = QTimer(self)
        self._timer.setInterval(poll_ms)
        self._timer.timeout.connect(self._poll)

    def submit(self, kind: Any, payload: Any = None, *, owner: QObject | None = None,
               on_event: Callable[[Any], None] | None = None, on_done: Callable[[Any], None] | None = None,
               on_failed: Callable[[str, str], None] | None = None,
               on_cancelled: Callable[[str], None] | None = None,
               on_message: Callable[[Any], None] | None = None) -> TaskHandle:
        tid = self.source.submit(kind, payload)
        handle = TaskHandle(self, tid, kind, owner)
        handle.connect(on_event=on_event, on_done=on_done, on_failed=on_failed, on_cancelled=on_cancelled,
                       on_message=on_message)
        was_busy = self.busy
        self._handles[tid] = handle
        if not was_busy:
            self.busy_changed.emit(True)
        if not self._timer.isActive():
            self._timer.start()
        return handle

    def cancel(self, task_id: int) -> None:
        self.source.cancel(task_id)

    @property
    def busy(self) -> bool:
        return bool(self._handles)

    def pending(self) -> list[TaskHandle]:
        return list(self._handles.values())

    # -- delivery --
    @Slot()
    def _poll(self) -> None:
        for msg in self.source.poll():
            self._deliver(msg)
        if not self._handles and not self._keep_polling():
            self._timer.stop()

    def _keep_polling(self) -> bool:
        return False

    def _deliver(self, msg) -> None:
        route(msg, self)

    def task_event(self, msg: TaskEvent) -> None:
        h = self._handles.get(msg.id)
        if h is None:
            return
        if h._owner_gone():
            self._handles.pop(msg.id)
            self.source.cancel(msg.id)  # nobody is left to see it
            self._went_idle_maybe()
        else:
            h._deliver(msg)

    def task_ended(self, msg: TaskEnd) -> None:
        h = self._handles.pop(msg.id, None)
        if h is not None:
            h._finish(msg)
            self._went_idle_maybe()

    def _went_idle_maybe(self) -> None:
        if not self._handles:
            self.busy_changed.emit(False)


class EngineClient(TaskClient):
    """The engine child process, seen from the GUI. All signals are emitted on the GUI thread."""

    ready = Signal(object)  # EngineReady
    crashed = Signal(str)  # the child died; its tasks failed and a new one is starting
    fatal = Signal(str)  # the engine cannot start (bad model file, too many crashes)
    document_changed = Signal(object)  # backend/idle_work.py DocumentStatus: the prompt saved, made exact

    def __init__(self, settings: EngineSettings, parent: QObject | None = None, *, auto_restart: bool = True):
        self.process = EngineProcess(settings, auto_restart=auto_restart)
        super().__init__(self.process, parent)

    @property
    def settings(self) -> EngineSettings:
        return self.process.settings

    @property
    def info(self) -> EngineReady | None:
        return self.process.info

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def start(self) -> None:
        self.process.start()
        self._timer.start()

    def restart(self, settings: EngineSettings | None = None) -> None:
        """Stop the engine (its pending tasks fail) and start it again, with new settings if given."""
        self.process.restart(settings)
        self._timer.start()

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop the child (joined); pending tasks get their failure now. Safe to call twice."""
        self.process.shutdown(timeout)
        self._poll()  # delivers the failures; the timer stops once nothing is pending

    def _keep_polling(self) -> bool:
        return self.process.running

    def engine_started(self, msg: EngineStarted) -> None:
        self.ready.emit(msg.ready)

    def engine_crashed(self, msg: EngineCrashed) -> None:
        self.crashed.emit(msg.message)

    def engine_fatal(self, msg: EngineFatal) -> None:
        self.fatal.emit(msg.message)

    def document_state(self, msg: DocumentState) -> None:
        self.document_changed.emit(msg.status)
