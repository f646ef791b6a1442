"""The GUI's side of background work: each task's events reach the one who submitted it, on the GUI thread.

A `TaskClient` wraps a Qt-free task source (the engine process of app/engine_process.py, or the thread
job runner of app/job_runner.py): `submit(kind, payload, on_event=..., on_done=..., on_failed=...,
on_cancelled=...)` returns a `TaskHandle` whose `cancel()` stops that task and no other (Anki's
QueryOp: every operation has its own success, failure and progress handlers). A QTimer polls the
source on the GUI thread; the source's poll delivers each message to its app/task_stream.py Task, whose
TaskHandle runs the callbacks there. A task submitted with `owner=widget` is cancelled, and its callbacks
dropped, once that widget is deleted.

`EngineClient` adds what concerns the engine as a whole: the signals ready, crashed, fatal and
busy_changed, and start / restart / shutdown.
"""
from __future__ import annotations

import logging
import sys
from typing import Any, Callable

import shiboken6
from PySide6.QtCore import QObject, QTimer, Signal, Slot

from app.engine_messages import CANCELLED, DONE, EVENT, FAILED, Receiver, TaskEnd, kind_of, route
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
from app.task_stream import Task

log = logging.getLogger(__name__)

POLL_MS = 15


class TaskHandle:
    """One submitted task (app/task_stream.py's Task) as its submitter sees it on the GUI thread: its id,
    its state, its callbacks, `cancel()`.

    Callbacks: on_event(event) any number of times, then exactly one of on_done(result),
    on_failed(error_type, message) or on_cancelled(message). The state changes before they run; none runs
    once the task's owner widget is deleted (the task is then cancelled at its next event).
    """

    def __init__(self, task: Task):
        self.task = task
        self._callbacks: dict[str, list[Callable]] = {"event": [], "done": [], "failed": [], "cancelled": [],
                                                      "message": []}
        task.listen(self._on_message)

    @property
    def id(self) -> int | None:
        return self.task.id

    @property
    def kind(self) -> Any:
        return self.task.kind

    @property
    def owner(self) -> QObject | None:
        return self.task.owner

    @property
    def state(self) -> str:
        return self.task.state

    @property
    def result(self) -> Any:
        return self.task.end.result if self.state == DONE else None

    @property
    def error(self) -> tuple[str, str] | None:
        """(error_type, message) of a failed or cancelled task."""
        state, end = self.state, self.task.end
        if state == FAILED:
            return end.error_type, end.message
        return ("Cancelled", end.message) if state == CANCELLED else None

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
        self.task.cancel()

    def running(self) -> bool:
        return self.task.running()

    def __repr__(self) -> str:
        kind = getattr(self.kind, "value", self.kind)
        return f"<TaskHandle {self.id} {kind} {self.state}>"

    # -- the task's listener (GUI thread: the client's poll delivers) --
    def _owner_gone(self) -> bool:
        return self.owner is not None and not shiboken6.isValid(self.owner)

    def _on_message(self, msg) -> None:
        if self._owner_gone():
            self.task.cancel()  # nobody is left to see it
            self._callbacks = {k: [] for k in self._callbacks}
            return
        kind = kind_of(msg)
        if kind == EVENT:
            self._call("event", msg.event)
        elif kind == DONE:
            self._call("done", msg.result)
        elif kind == FAILED:
            self._call("failed", msg.error_type, msg.message)
        else:
            self._call("cancelled", msg.message)
        self._call("message", msg)
        if kind != EVENT:
            self._callbacks = {k: [] for k in self._callbacks}  # nothing more will come; free the closures

    def _call(self, name: str, *args) -> None:
        for fn in list(self._callbacks[name]):
            try:
                fn(*args)
            except Exception:  # noqa: BLE001 - one bad callback must not lose the other messages
                sys.excepthook(*sys.exc_info())


class TaskClient(QObject, Receiver):
    """Polls a task source on the GUI thread, so its tasks' handles run their callbacks there.

    The source has submit_task(task), cancel(id), poll(on_message=...) and its pending table `tasks`
    (app/task_stream.py): its poll delivers each task's messages to the Task; this client only keeps the
    timer running while something is pending and routes the engine's own messages (app/engine_messages.route).
    """

    busy_changed = Signal(bool)  # some task of this client is pending / none is

    def __init__(self, source, parent: QObject | None = None, *, poll_ms: int = POLL_MS):
        super().__init__(parent)
        self.source = source
        self._timer = QTimer(self)
        self._timer.setInterval(poll_ms)
        self._timer.timeout.connect(self._poll)

    def submit(self, kind: Any, payload: Any = None, *, owner: QObject | None = None,
               on_event: Callable[[Any], None] | None = None, on_done: Callable[[Any], None] | None = None,
               on_failed: Callable[[str, str], None] | None = None,
               on_cancelled: Callable[[str], None] | None = None,
               on_message: Callable[[Any], None] | None = None) -> TaskHandle:
        handle = TaskHandle(Task(kind, payload, owner=owner))
        handle.connect(on_event=on_event, on_done=on_done, on_failed=on_failed, on_cancelled=on_cancelled,
                       on_message=on_message)
        self.submit_task(handle.task)
        return handle

    def submit_task(self, task: Task) -> Task:
        """Hand `task` to the source; its messages reach its listeners on the GUI thread."""
        was_busy = self.busy
        self.source.submit_task(task)
        if not was_busy:
            self.busy_changed.emit(True)
        if not self._timer.isActive():
            self._timer.start()
        return task

    def cancel(self, task_id: int) -> None:
        self.source.cancel(task_id)

    @property
    def busy(self) -> bool:
        return self.source.busy

    def pending(self) -> list[Task]:
        return list(self.source.tasks)

    # -- delivery --
    @Slot()
    def _poll(self) -> None:
        self.source.poll(on_message=self._deliver)
        if not self.busy and not self._keep_polling():
            self._timer.stop()

    def _keep_polling(self) -> bool:
        return False

    def _deliver(self, msg) -> None:
        route(msg, self)

    def task_event(self, msg: TaskEvent) -> None:
        pass  # the source delivered it to its Task already

    def task_ended(self, msg: TaskEnd) -> None:
        if not self.busy:
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
