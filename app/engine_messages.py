"""The one place the engine's messages are sorted by kind (`kind_of`, `is_end`), and their one router. A task's
messages go to its Task through its source's table (app/task_stream.py); every poller of a source (the GUI's
TaskClient and EngineClient, app/engine_client.py; the server's ProcessGateway, app/server/gateway.py) hands
each message to `route`, which calls the reader's method for that kind; a reader overrides the ones it cares
about (a `Receiver` logs the rest). The process, the job runner, the task stream, the server's runs and the
self-test ask `kind_of` rather than testing types themselves."""
from __future__ import annotations

import logging

from app.engine_protocol import (
    DocumentState,
    EngineCrashed,
    EngineFatal,
    EngineStarted,
    TaskCancelled,
    TaskDone,
    TaskEvent,
    TaskFailed,
)

log = logging.getLogger(__name__)

TaskEnd = TaskDone | TaskFailed | TaskCancelled


class Receiver:
    """What a reader of the engine's messages may do with each kind; by default, nothing (logged)."""

    def task_event(self, msg: TaskEvent) -> None:
        self.unexpected(msg)

    def task_ended(self, msg: TaskEnd) -> None:
        self.unexpected(msg)

    def engine_started(self, msg: EngineStarted) -> None:
        self.unexpected(msg)

    def engine_crashed(self, msg: EngineCrashed) -> None:
        self.unexpected(msg)

    def engine_fatal(self, msg: EngineFatal) -> None:
        self.unexpected(msg)

    def document_state(self, msg: DocumentState) -> None:
        log.debug("document state not shown here: %s", msg)

    def unexpected(self, msg) -> None:
        log.warning("unexpected message %r", msg)


# Each kind of message, named once
EVENT, DONE, FAILED, CANCELLED = "event", "done", "failed", "cancelled"
STARTED, CRASHED, FATAL, DOCUMENT = "started", "crashed", "fatal", "document"
ENDS = (DONE, FAILED, CANCELLED)  # a task's last message: exactly one of these ends each task

_KINDS = {
    TaskEvent: EVENT,
    TaskDone: DONE,
    TaskFailed: FAILED,
    TaskCancelled: CANCELLED,
    EngineStarted: STARTED,
    EngineCrashed: CRASHED,
    EngineFatal: FATAL,
    DocumentState: DOCUMENT,
}
_METHODS = {EVENT: "task_event", DONE: "task_ended", FAILED: "task_ended", CANCELLED: "task_ended",
            STARTED: "engine_started", CRASHED: "engine_crashed", FATAL: "engine_fatal", DOCUMENT: "document_state"}


def kind_of(msg) -> str | None:
    """EVENT, DONE, FAILED, CANCELLED (a task's), STARTED, CRASHED, FATAL, DOCUMENT (the engine's); None:
    not a message of the engine's."""
    return _KINDS.get(type(msg))


def is_end(msg) -> bool:
    """Whether `msg` ends its task (nothing more comes for that task id)."""
    return kind_of(msg) in ENDS


def route(msg, receiver: Receiver) -> None:
    """Call `receiver`'s method for the kind of `msg`."""
    method = _METHODS.get(kind_of(msg))
    if method is None:
        receiver.unexpected(msg)
    else:
        getattr(receiver, method)(msg)
