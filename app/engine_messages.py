"""The one router of the engine child's messages. Every reader of its stream (the GUI's TaskClient and
EngineClient, app/engine_client.py; the server's EngineGateway, app/server/gateway.py) hands each message
to `route`, which calls the reader's method for that kind of message; a reader overrides the ones it
cares about (a `Receiver` logs the rest)."""
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


_METHODS = {
    TaskEvent: "task_event",
    TaskDone: "task_ended",
    TaskFailed: "task_ended",
    TaskCancelled: "task_ended",
    EngineStarted: "engine_started",
    EngineCrashed: "engine_crashed",
    EngineFatal: "engine_fatal",
    DocumentState: "document_state",
}


def route(msg, receiver: Receiver) -> None:
    """Call `receiver`'s method for the kind of `msg`."""
    method = _METHODS.get(type(msg))
    if method is None:
        receiver.unexpected(msg)
    else:
        getattr(receiver, method)(msg)
