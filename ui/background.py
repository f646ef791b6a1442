"""Run one backend call (a download) on a worker thread; its events reach the GUI thread as queued signals.

The worker never touches a widget: it emits `event`/`done`/`failed` from its own thread, and Qt queues
them to the receiver on the GUI thread. `stop()` asks the job to cancel and joins the thread (on quit).
"""
from __future__ import annotations

import threading
from typing import Callable

from PySide6.QtCore import QObject, Signal


class BackgroundJob(QObject):
    event = Signal(object)
    done = Signal(object)
    failed = Signal(str, str)  # error type, message

    def __init__(self, fn: Callable[[Callable[[object], None]], object], cancel: Callable[[], None], parent=None):
        super().__init__(parent)
        self._fn, self._cancel = fn, cancel
        self._over = False
        self._thread = threading.Thread(target=self._run, name="ridgefill-download", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            result = self._fn(self.event.emit)
        except Exception as exc:  # noqa: BLE001 - every failure is reported, typed errors carry the reason
            self._over = True
            self.failed.emit(type(exc).__name__, str(exc))
        else:
            self._over = True
            self.done.emit(result)

    def running(self) -> bool:
        # over before the signal leaves: its slot may run while this thread is still unwinding
        return self._thread.is_alive() and not self._over

    def stop(self, timeout: float = 10.0) -> None:
        self._cancel()
        if self._thread.is_alive():
            self._thread.join(timeout)
