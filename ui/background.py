"""Background jobs for the widgets: app/job_runner.py's worker threads, delivered like engine tasks.

`jobs.submit(label, fn, owner=self, on_event=..., on_done=..., on_failed=..., on_cancelled=...)` runs
`fn(ctx)` on a worker thread (it must never touch a widget) and returns a TaskHandle with `cancel()`;
the callbacks run on the GUI thread (app/engine_client.py: TaskClient).
"""
from __future__ import annotations

from PySide6.QtCore import QObject

from app.engine_client import TaskClient
from app.job_runner import JobRunner


class BackgroundJobs(TaskClient):
    def __init__(self, parent: QObject | None = None):
        self.runner = JobRunner()
        super().__init__(self.runner, parent)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Cancel every job and join its thread (on quit)."""
        self.runner.shutdown(timeout)
        self._poll()
