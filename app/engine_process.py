"""The engine process, seen from the parent: `EngineProcess` starts the child (app/engine_child.py) and
drives it by queues; no Qt.

Why a process: a llama context is not thread-safe, and a crash inside llama.cpp (or a bad pointer write
by the KV injection) must cost the user an engine restart, not the app or the chat.

`submit` returns a task id (`submit_task` takes an app/task_stream.py Task), `poll` delivers the messages
that arrived to their tasks and returns them (never blocking), and a dead child is noticed by `poll`: its
tasks fail with a clear message and a fresh child starts with the same settings. The GUI wraps it in app/engine_client.py; a local server drives it through app/server/gateway.py.
"""
from __future__ import annotations

import itertools
import logging
import multiprocessing as mp
import queue
import signal
import time
from typing import Any, Callable

from app.engine_child import child_main
from app.engine_messages import DOCUMENT, ENDS, EVENT, FATAL, STARTED, kind_of
from app.engine_protocol import (
    PAYLOAD_TYPES,
    CancelTask,
    EngineCrashed,
    EngineFatal,
    EngineReady,
    EngineSettings,
    StopEngine,
    TaskFailed,
    TaskKind,
    TaskMessage,
)
from app.task_stream import Task, TaskTable

log = logging.getLogger(__name__)

MAX_MESSAGES_PER_POLL = 400  # a caller on an event loop stays responsive under a flood of token events
MAX_RESTARTS = 3  # within RESTART_WINDOW_S; more means the engine cannot run, so stop trying
RESTART_WINDOW_S = 60.0
TASK_KINDS = (EVENT,) + ENDS  # a task's messages, delivered to its Task
FEEDER_JOIN_S = 2.0  # all feeders together: milliseconds when idle, more on a loaded machine; a stuck one costs this at shutdown


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
        self.document = None  # the child's last DocumentState status (backend/idle_work.py)
        self.tasks = TaskTable()  # pending: submitted, and their end not yet delivered by a poll
        self._ctx = mp.get_context("spawn")
        self._ids = itertools.count(1)  # never reset: a late message from an old child matches no task
        self._proc = None
        self._tasks = self._events = self._cancels = None
        self._outbox: list = []  # messages made here (a death, a restart), delivered by the next poll
        self._state = "new"  # new | running | fatal | shut
        self._fatal: EngineFatal | None = None
        self._crash_times: list[float] = []
        self._cut = ""  # why the child's messages could not be read, said with its death

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
        # The child has its copy of the events pipe's write end now. Without the parent's, a child that dies
        # halfway through writing a message leaves EOF behind, not a read that waits forever for the rest.
        self._events._writer.close()  # multiprocessing's own attribute; the parent never puts events
        self._cut = ""
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
                for tid in self.tasks.ids():
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
        return bool(self.tasks)

    @property
    def running(self) -> bool:
        """A child is started (loading or ready); False when new, shut down or fatal."""
        return self._state == "running"

    # -- tasks --
    def submit(self, kind: TaskKind, payload: Any = None) -> int:
        """Queue a task (starting the child if it was never started); returns its id."""
        return self.submit_task(Task(kind, payload)).id

    def submit_task(self, task: Task) -> Task:
        """Queue `task` (its kind and payload), bound to its id here; its messages reach it from `poll`."""
        kind = TaskKind(task.kind)
        want = PAYLOAD_TYPES[kind]
        if not isinstance(task.payload, want):
            raise TypeError(f"a {kind.value} task takes {want}, not {type(task.payload).__name__}")
        if self._state == "new":
            self.start()
        tid = next(self._ids)
        task.id = tid
        self.tasks.add(task)  # before bind: a cancel asked before the submit goes out now, and needs it pending
        task.bind(tid, lambda: self.cancel(tid))
        if self._state != "running":
            why = self._fatal.message if self._fatal else "the engine is shut down"
            self._outbox.append(TaskFailed(tid, "EngineError", f"The engine is not running: {why}"))
        else:
            self._tasks.put(TaskMessage(tid, kind, task.payload))
        return task

    def cancel(self, task_id: int) -> None:
        """Stop this task at its next check (or before it starts); other tasks are not touched."""
        if task_id in self.tasks and self._cancels is not None:
            self._put(self._cancels, CancelTask(task_id))

    # -- messages --
    def poll(self, max_messages: int = MAX_MESSAGES_PER_POLL, on_message: Callable[[Any], None] | None = None) -> list:
        """The messages that arrived, in order (never blocks); each task's is delivered to its Task, then each
        is handed to `on_message`. Notices a dead child and restarts it."""
        out: list = []

        def hand_out(msgs: list) -> None:
            for msg in msgs:
                if kind_of(msg) in TASK_KINDS and not self.tasks.deliver(msg):
                    continue  # not pending: a late message from an old child, or a second failure
                out.append(msg)
                if on_message is not None:
                    on_message(msg)

        hand_out(self._outbox_taken())
        while len(out) < max_messages and self._events is not None:
            try:
                msg = self._events.get_nowait()
            except queue.Empty:
                break
            except EOFError:  # the pipe ended between two messages: the child is gone
                self._cut_off("")
                break
            except OSError:  # multiprocessing's "got end of file during message": it died while writing one
                self._cut_off("its last message was cut off")
                break
            except Exception as exc:  # noqa: BLE001 - a message that does not unpickle: the pipe is out of step
                self._cut_off(f"a message from it could not be read ({type(exc).__name__})")
                break
            hand_out(self._accept(msg))
        proc = self._proc
        if proc is not None and self._state == "running" and not proc.is_alive():
            hand_out(self._drain())
            self._on_death(proc.exitcode)
            hand_out(self._outbox_taken())
        return out

    def _outbox_taken(self) -> list:
        out, self._outbox = self._outbox, []
        return out

    def _accept(self, msg) -> list:
        """Bookkeeping for one message from the child; returns the messages it stands for (a fatal one: the
        pending tasks' failures, then itself)."""
        kind = kind_of(msg)
        if kind == STARTED:
            self.info = msg.ready
        elif kind == FATAL:
            self._state = "fatal"  # the child exits by itself; that is not a crash to restart from
            self._fatal = msg
            self._fail_pending(msg.error_type, msg.message)
            return self._outbox_taken() + [msg]
        elif kind == DOCUMENT:
            self.document = msg.status
        elif kind not in TASK_KINDS:
            log.warning("unknown message from the engine process: %r", msg)
            return []
        return [msg]

    def _cut_off(self, why: str) -> None:
        """The child's messages cannot be read any more: end it, so the death below fails its tasks and restarts."""
        proc = self._proc
        if proc is None or self._state != "running":
            return
        self._cut = self._cut or why
        if proc.is_alive():
            proc.kill()
            proc.join(2)

    def _drain(self) -> list:
        out = []
        while True:
            try:
                msg = self._events.get_nowait()
            except Exception:  # noqa: BLE001 - empty or broken: nothing more to read
                return out
            out.extend(self._accept(msg))

    def _fail_pending(self, error_type: str, message: str) -> None:
        """Each pending task's failure, delivered by the next poll (so its reader hears of it on its own thread)."""
        self._outbox.extend(TaskFailed(tid, error_type, message) for tid in self.tasks.ids())

    def _on_death(self, exitcode: int | None) -> None:
        how = f"exit code {exitcode}"
        if exitcode is not None and exitcode < 0:
            try:
                how = f"signal {signal.Signals(-exitcode).name}"
            except ValueError:
                how = f"signal {-exitcode}"
        if self._cut:
            how += f"; {self._cut}"
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
        queues = [q for q in (self._tasks, self._events, self._cancels) if q is not None]
        self._tasks = self._events = self._cancels = None
        for q in queues:
            q.cancel_join_thread()  # an unbounded join could block the caller's exit on a full pipe
            q.close()
        # A bounded wait for each feeder thread, so the queue's locks are released on this thread: released
        # last by a daemon feeder, their cleanup (unlink, then tell the resource tracker) can be cut by the
        # exit in between, and the tracker warns at exit about a semaphore already gone. Bounded: a feeder
        # writing to a dead child's full pipe never ends.
        deadline = time.monotonic() + FEEDER_JOIN_S
        for q in queues:
            feeder = getattr(q, "_thread", None)  # multiprocessing's own attribute; no public bounded join
            if feeder is not None:
                feeder.join(max(0.0, deadline - time.monotonic()))
