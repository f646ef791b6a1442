"""The engine as the server sees it: tasks submitted from any thread, their messages handed to a callback.

`EngineProcess` is not thread-safe and must be driven from one thread, while the HTTP server runs on
an asyncio loop in another. `ProcessGateway` gives the EngineProcess a thread of its own (the pump):
`submit` and `cancel` only put commands on a queue that the pump carries out, in arrival order, so
tasks reach the engine child (which serves them one at a time, oldest first) in the order the
requests came. The pump polls the process and calls each task's `deliver` with its TaskEvents and
its one TaskDone, TaskFailed or TaskCancelled, on the pump thread.

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
from backend.errors import EngineError

log = logging.getLogger(__name__)

Deliver = Callable[[Any], None]  # called with TaskEvent, then one TaskDone | TaskFailed | TaskCancelled

BUSY_POLL_S = 0.002  # while tasks run: the longest a token waits in the pump before it is handed on
IDLE_POLL_S = 0.05  # nothing pending: a submit wakes the pump at once anyway


class Ticket:
    """One submitted task as its submitter holds it. `task_id` is set once the engine has it."""

    __slots__ = ("kind", "payload", "deliver", "task_id", "cancel_requested", "ended")

    def __init__(self, kind: TaskKind, payload: Any, deliver: Deliver):
        self.kind = kind
        self.payload = payload
        self.deliver = deliver
        self.task_id: int | None = None
        self.cancel_requested = False
        self.ended = False


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

    def submit(self, kind: TaskKind, payload: Any, deliver: Deliver) -> Ticket: ...

    def cancel(self, ticket: Ticket) -> None: ...


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
        self._tickets: dict[int, Ticket] = {}
        self._info: EngineReady | None = None
        self._state = "loading"
        self._problem = "the model is loading"
        self._thread: threading.Thread | None = None

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
    def submit(self, kind: TaskKind, payload: Any, deliver: Deliver) -> Ticket:
        ticket = Ticket(check_payload(kind, payload), payload, deliver)
        self._commands.put(("submit", ticket))
        self._wake.set()
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        ticket.cancel_requested = True
        self._commands.put(("cancel", ticket))
        self._wake.set()

    # -- the pump thread --
    def _pump(self) -> None:
        try:
            while not self._stop.is_set():
                self._run_commands()
                for msg in self.process.poll():
                    self._dispatch(msg)
                self._wake.wait(BUSY_POLL_S if self._tickets else IDLE_POLL_S)
                self._wake.clear()
        except Exception:  # noqa: BLE001 - a bug here must not leave the server waiting forever
            log.exception("the engine gateway stopped")
            self._state, self._problem = "fatal", "the engine gateway stopped unexpectedly (see the log)"
        finally:
            self.process.shutdown(reason="the server was stopped")
            for msg in self.process.poll():
                self._dispatch(msg)
            self._run_commands()  # submitted while stopping: they fail below
            for ticket in list(self._tickets.values()):
                self._end(ticket, TaskFailed(ticket.task_id or 0, "EngineError", "The server was stopped."))
            if self._state != "fatal":
                self._state, self._problem = "stopped", "the server was stopped"
            self._info = None
            self._ready.set()

    def _run_commands(self) -> None:
        while True:
            try:
                what, ticket = self._commands.get_nowait()
            except queue.Empty:
                return
            if what == "submit":
                if self._stop.is_set():
                    self._end(ticket, TaskFailed(0, "EngineError", "The server is stopping."))
                    continue
                tid = self.process.submit(ticket.kind, ticket.payload)
                ticket.task_id = tid
                self._tickets[tid] = ticket
                if ticket.cancel_requested:
                    self.process.cancel(tid)
            elif ticket.task_id is not None and not ticket.ended:
                self.process.cancel(ticket.task_id)

    def _dispatch(self, msg) -> None:
        route(msg, self)

    # -- app/engine_messages.Receiver --
    def task_event(self, msg: TaskEvent) -> None:
        ticket = self._tickets.get(msg.id)
        if ticket is not None:
            self._call(ticket, msg)

    def task_ended(self, msg: TaskEnd) -> None:
        ticket = self._tickets.pop(msg.id, None)
        if ticket is not None:
            self._end(ticket, msg)

    def engine_started(self, msg: EngineStarted) -> None:
        self._info, self._state, self._problem = msg.ready, "ready", ""
        self._ready.set()

    def engine_crashed(self, msg: EngineCrashed) -> None:
        self._info, self._state, self._problem = None, "loading", msg.message
        self._ready.clear()

    def engine_fatal(self, msg: EngineFatal) -> None:
        self._info, self._state, self._problem = None, "fatal", msg.message
        self._ready.set()

    def _end(self, ticket: Ticket, msg) -> None:
        self._tickets.pop(ticket.task_id, None)
        ticket.ended = True
        self._call(ticket, msg)

    @staticmethod
    def _call(ticket: Ticket, msg) -> None:
        try:
            ticket.deliver(msg)
        except Exception:  # noqa: BLE001 - one bad receiver must not stop the others' messages
            log.exception("delivering %s failed", type(msg).__name__)
