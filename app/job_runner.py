"""Background jobs on worker threads, without Qt, speaking the engine's task messages.

For work that is slow but safe off the engine process: hub downloads, hashing map folders, reading the
catalogue and the disk. `submit(label, fn)` runs `fn(ctx)` on its own daemon thread and returns a job
id; `fn` reports with `ctx.emit(event)` and checks `ctx.cancelled` between chunks (or registers
`ctx.on_cancel(callback)`, e.g. a DownloadJob's cancel). `poll()` delivers to each job's Task
(app/task_stream.py) and returns TaskEvent, then exactly one of TaskDone, TaskFailed or TaskCancelled per
job: the same messages as app/engine_process.py, so the GUI's TaskClient (app/engine_client.py) delivers
both the same way.
"""
from __future__ import annotations

import itertools
import queue
import threading
import time
from typing import Any, Callable

from app.engine_messages import EVENT, kind_of
from app.engine_protocol import TaskCancelled, TaskDone, TaskEvent, TaskFailed
from app.task_stream import Task, TaskTable
from backend.errors import Cancelled

MAX_MESSAGES_PER_POLL = 400
# Events waiting to be polled, all jobs together: past it a job's emit waits (a remote answer streaming faster
# than the GUI polls, or a window that stopped polling, must not fill the memory); endings always go in
MAX_QUEUED_EVENTS = 4_096
WAIT_S = 0.05  # how often a waiting emit looks at its job's stop flag


class JobContext:
    """What a job's function gets: a way to report, and to learn that it should stop."""

    def __init__(self, job_id: int, emit: Callable[[Any], None], room: "Room | None" = None):
        self.id = job_id
        self._emit = emit
        self._room = room
        self._cancel = threading.Event()
        self._on_cancel: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def emit(self, event: Any) -> None:
        """Queue `event`; while the queue is full the job's own thread waits, and a cancelled job's event is
        dropped (nobody reads it)."""
        if self._room is not None and not self._room.take(lambda: self.cancelled):
            return
        self._emit(TaskEvent(self.id, event))

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def on_cancel(self, fn: Callable[[], None]) -> None:
        """Call `fn` when the job is cancelled (at once if it already is); any thread may call it."""
        with self._lock:
            self._on_cancel.append(fn)
            now = self._cancel.is_set()
        if now:
            fn()

    def _request_cancel(self) -> None:
        with self._lock:
            self._cancel.set()
            fns = list(self._on_cancel)
        for fn in fns:
            fn()


class Room:
    """The count of events queued: an emit adds one, waiting while MAX are queued (unless it runs on the thread
    that polls, which would wait for itself: it then goes over), a poll takes them off."""

    def __init__(self, size: int):
        self.size = size
        self.queued = 0
        self.freed = threading.Condition()
        self.poller: int | None = None  # the thread that last polled

    def take(self, cancelled: Callable[[], bool]) -> bool:
        """True once the event may be queued; False if the job was cancelled while it waited."""
        with self.freed:
            while self.queued >= self.size and threading.get_ident() != self.poller:
                if cancelled():
                    return False
                self.freed.wait(WAIT_S)
            self.queued += 1
        return True

    def give_back(self) -> None:
        with self.freed:
            self.queued -= 1
            self.freed.notify()


class JobRunner:
    """Runs each job on its own worker thread; drive submit / cancel / poll from one thread."""

    def __init__(self, name: str = "ridgefill-job"):
        self.name = name
        self._ids = itertools.count(1)
        self._messages: queue.Queue = queue.Queue()
        self._room = Room(MAX_QUEUED_EVENTS)
        self.tasks = TaskTable()  # pending: submitted, and their end not yet delivered by a poll
        self._threads: list[threading.Thread] = []  # the workers that may still run, for shutdown's join

    def submit(self, label: str, fn: Callable[[JobContext], Any]) -> int:
        return self.submit_task(Task(label, fn)).id

    def submit_task(self, task: Task, fn: Callable[[JobContext], Any] | None = None) -> Task:
        """Run `fn` (by default the task's payload) for `task`, whose kind is its label; bound to its id here."""
        fn = task.payload if fn is None else fn
        if not callable(fn):
            raise TypeError(f"a job takes a function of its context, not {type(fn).__name__}")
        jid = next(self._ids)
        ctx = JobContext(jid, self._messages.put, self._room)
        task.bind(jid, ctx._request_cancel)
        thread = threading.Thread(target=self._run, args=(ctx, fn), name=f"{self.name}-{jid}-{task.kind}"[:60],
                                  daemon=True)
        self.tasks.add(task)
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()
        return task

    def _run(self, ctx: JobContext, fn) -> None:
        try:
            result = fn(ctx)
        except BaseException as exc:  # noqa: BLE001 - every ending is reported; typed errors carry the reason
            if ctx.cancelled or isinstance(exc, (Cancelled, KeyboardInterrupt)):
                self._messages.put(TaskCancelled(ctx.id, str(exc) or "cancelled"))
            else:
                self._messages.put(TaskFailed(ctx.id, type(exc).__name__, str(exc)))
        else:
            self._messages.put(TaskDone(ctx.id, result))

    def cancel(self, job_id: int) -> None:
        task = self.tasks.get(job_id)
        if task is not None:
            task.cancel()

    @property
    def busy(self) -> bool:
        return bool(self.tasks)

    def poll(self, max_messages: int = MAX_MESSAGES_PER_POLL, on_message: Callable[[Any], None] | None = None) -> list:
        """The messages that arrived, in order, each delivered to its Task first, then handed to `on_message`."""
        self._room.poller = threading.get_ident()
        out = []
        while len(out) < max_messages:
            try:
                msg = self._messages.get_nowait()
            except queue.Empty:
                break
            if kind_of(msg) == EVENT:
                self._room.give_back()
            if self.tasks.deliver(msg):
                out.append(msg)
                if on_message is not None:
                    on_message(msg)
        return out

    def shutdown(self, timeout: float = 10.0) -> None:
        """Cancel every job and wait up to `timeout` seconds in all for their threads."""
        for task in self.tasks:
            task.cancel()
        deadline = time.monotonic() + timeout
        for thread in list(self._threads):
            thread.join(max(0.0, deadline - time.monotonic()))
