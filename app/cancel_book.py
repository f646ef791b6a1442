"""The engine child's view of the cancel queue, and of the work waiting behind the running task: the ids
asked to stop (read only when a handler checks) and whether a task that yields (the tune started by
itself) should stop for other work."""
from __future__ import annotations

import queue

from app.engine_protocol import CancelTask


class CancelBook:
    """The child's view of the cancel queue: the ids asked to stop, read only when a handler checks."""

    def __init__(self, cancels, busy=None):
        self._queue = cancels
        self._ids: set[int] = set()
        self.busy = busy or (lambda: False)  # whether other work waits: a task that yields stops for it

    def is_cancelled(self, task_id: int) -> bool:
        while True:
            try:
                msg = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(msg, CancelTask):
                self._ids.add(msg.id)
        return task_id in self._ids

    def starting(self, task_id: int) -> None:
        """Tasks run in id order: a cancel for an older id came too late to matter."""
        self._ids = {i for i in self._ids if i >= task_id}
