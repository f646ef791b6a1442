"""One task, from its submit to its one end, as every part of the app sees it; no Qt.

A `Task` owns "event or end": a feeder hands it the engine's messages for it (`deliver`), TaskEvents and
then exactly one TaskDone, TaskFailed or TaskCancelled; it calls its listeners with each, on the feeder's
thread, and ignores anything after the end. It owns its cancel too: `cancel()` asks once, and reaches the
source as soon as the source has taken the task (`bind`).

A source's `TaskTable` is the one pending table: the tasks it took and whose end it has not delivered.
The feeders are the sources' polls: app/engine_process.py (the engine child's messages), app/job_runner.py
(worker threads' jobs, also the remote engine's answers, app/remote_engine.py).

The readers are thin adapters over a Task: the GUI's TaskHandle (app/engine_client.py, its callbacks on the
GUI thread), `LoopReader` (the server's asyncio side, app/server/api.py) and `TaskReader` (a blocking
iteration, for a command-line caller such as app/selftest.py).
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from typing import Any, Callable, Iterator

from app.engine_messages import is_end, kind_of

log = logging.getLogger(__name__)

PENDING = "pending"  # a task's state before its end; after it, the end's kind: DONE, FAILED or CANCELLED
Listener = Callable[[Any], None]  # called with each TaskEvent, then the task's one end


class Task:
    """One task: its kind and payload, its id once a source took it, its listeners, its end, its cancel.

    `deliver` is the feeder's (the thread that polls the source); `listen` and `cancel` may come from the
    thread that drives the source, or before the source took the task from the one that made it."""

    def __init__(self, kind: Any = None, payload: Any = None, deliver: Listener | None = None, *,
                 owner: Any = None):
        self.kind = kind
        self.payload = payload  # let go at the end: a long prompt is not kept by whoever keeps the task
        self.owner = owner  # who asked for it (a widget, a gateway): read by the adapter that serves it
        self.id: int | None = None  # the source's id for it, set by `bind`
        self.end = None  # the TaskDone, TaskFailed or TaskCancelled, once delivered
        self.cancel_requested = False
        self._stop: Callable[[], None] | None = None  # how the source stops it, set by `bind`
        self._listeners: list[Listener] = [deliver] if deliver is not None else []
        self._lock = threading.Lock()  # listen and cancel may race the feeder

    # -- the source's --
    def bind(self, task_id: int, stop: Callable[[], None]) -> "Task":
        """The source took it as `task_id`, and `stop` cancels it there; a cancel asked before goes now."""
        with self._lock:
            self.id, self._stop = task_id, stop
            stop_now = self.cancel_requested and self.end is None
        if stop_now:
            stop()
        return self

    def deliver(self, msg) -> None:
        """One message for this task: an event, or its end (after which nothing more is delivered)."""
        with self._lock:
            if self.end is not None:
                return  # already ended (abandoned by its reader, or a second end): nobody waits for more
            listeners = list(self._listeners)
            if is_end(msg):
                self.end, self.payload, self._listeners = msg, None, []
        for fn in listeners:
            try:
                fn(msg)
            except Exception:  # noqa: BLE001 - one bad listener must not stop the others' messages
                log.exception("a listener of task %s failed on %s", self.id, type(msg).__name__)

    # -- the readers' --
    def listen(self, fn: Listener) -> "Task":
        """Call `fn` with each message delivered from now on; with the end at once if it already came."""
        with self._lock:
            end = self.end
            if end is None:
                self._listeners.append(fn)
        if end is not None:
            fn(end)
        return self

    def cancel(self) -> None:
        """Ask the source to stop it, once; a task that ended is left as it is."""
        with self._lock:
            if self.cancel_requested or self.end is not None:
                return
            self.cancel_requested = True
            stop = self._stop
        if stop is not None:
            stop()

    @property
    def state(self) -> str:
        return PENDING if self.end is None else kind_of(self.end)

    def running(self) -> bool:
        return self.end is None

    def __repr__(self) -> str:
        kind = getattr(self.kind, "value", self.kind)
        return f"<Task {self.id} {kind} {self.state}>"


class TaskTable:
    """A source's pending tasks by id: added when it takes one, removed when it delivers the end."""

    def __init__(self):
        self._tasks: dict[int, Task] = {}

    def add(self, task: Task) -> None:
        self._tasks[task.id] = task

    def get(self, task_id: int) -> Task | None:
        return self._tasks.get(task_id)

    def deliver(self, msg) -> bool:
        """Hand `msg` to its pending task (an end removes it); False for an id that is not pending."""
        task = self._tasks.pop(msg.id, None) if is_end(msg) else self._tasks.get(msg.id)
        if task is None:
            return False
        task.deliver(msg)
        return True

    def ids(self) -> list[int]:
        return sorted(self._tasks)

    def __iter__(self) -> Iterator[Task]:
        return iter(list(self._tasks.values()))

    def __contains__(self, task_id: int) -> bool:
        return task_id in self._tasks

    def __len__(self) -> int:
        return len(self._tasks)


class TaskReader:
    """A task's messages read blocking, in order, its end last (the command line's reader)."""

    def __init__(self, task: Task):
        self.task = task
        self._arrived: queue.SimpleQueue = queue.SimpleQueue()
        task.listen(self._arrived.put)  # here, not at the first read: nothing delivered after this is lost

    def messages(self, pump: Callable[[], Any] | None = None, timeout: float | None = None,
                 wait_s: float = 0.05) -> Iterator[Any]:
        """Yield each message as it comes, the end last. `pump` (e.g. the source's poll) is called while
        waiting, for a source nobody else polls; past `timeout` seconds it stops without the end."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if pump is not None:
                pump()
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            try:
                msg = self._arrived.get(timeout=wait_s if pump is not None else left)
            except queue.Empty:
                continue
            yield msg
            if is_end(msg):
                return


class LoopReader:
    """A task's messages on an asyncio loop (the server's reader): `deliver_threadsafe` is a listener for
    any thread, `get()` awaits the next message, `end` is set once the end reached the loop."""

    def __init__(self, on_end: Callable[["LoopReader"], None] | None = None):
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._on_end = on_end
        self.end = None

    def deliver_threadsafe(self, msg) -> None:  # the feeder's thread
        try:
            self._loop.call_soon_threadsafe(self._arrived, msg)
        except RuntimeError:  # the loop is closed: the server stopped, nobody waits for this
            pass

    def _arrived(self, msg) -> None:  # the loop's thread
        if is_end(msg) and self.end is None:
            self.end = msg
            if self._on_end is not None:
                self._on_end(self)
        self._queue.put_nowait(msg)

    async def get(self):
        return await self._queue.get()

    async def result(self):
        """Wait for the end message (events are dropped)."""
        while not is_end(msg := await self.get()):
            pass
        return msg

