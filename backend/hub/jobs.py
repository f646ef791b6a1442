"""The state machine every download goes through, and the events a UI watches.

    queued -> downloading -> verifying -> ready
       |           |             |
       +-----------+-------------+----> failed(reason)      (cancel is failed("cancelled ..."))

`queued -> ready` is allowed too: the thing was already installed and verified.
A job is driven by one worker thread; `cancel()` may be called from any thread.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable


class State(str, Enum):
    QUEUED = "queued"
    DOWNLOADING = "downloading"
    VERIFYING = "verifying"
    READY = "ready"
    FAILED = "failed"


_NEXT = {
    State.QUEUED: {State.DOWNLOADING, State.READY, State.FAILED},
    State.DOWNLOADING: {State.VERIFYING, State.FAILED},
    State.VERIFYING: {State.READY, State.FAILED},
    State.READY: set(),
    State.FAILED: set(),
}


@dataclass(frozen=True)
class DownloadEvent:
    label: str
    state: State
    done: int  # bytes downloaded (or hashed, while verifying)
    total: int | None
    file: str = ""
    reason: str | None = None  # why it failed
    path: str | None = None  # where the ready thing is
    warnings: tuple[str, ...] = ()
    elapsed_s: float = 0.0
    fit: str = ""  # does it fit this machine (disk, memory), known once the size is
    note: str = ""  # why nothing moves yet, e.g. waiting for another download of the same thing


@dataclass
class DownloadJob:
    label: str
    on_event: Callable[[DownloadEvent], None] | None = None
    state: State = State.QUEUED
    done: int = 0
    total: int | None = None
    file: str = ""
    reason: str | None = None
    path: str | None = None
    warnings: list[str] = field(default_factory=list)
    fit: str = ""
    note: str = ""
    history: list[State] = field(default_factory=lambda: [State.QUEUED])
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False)
    _t0: float = field(default_factory=time.monotonic, repr=False)

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    @property
    def finished(self) -> bool:
        return self.state in (State.READY, State.FAILED)

    def move(self, state: State, *, reason: str | None = None, path: str | None = None) -> None:
        if state not in _NEXT[self.state]:
            raise RuntimeError(f"download state machine: {self.state.value} -> {state.value} is not allowed")
        self.state = state
        self.history.append(state)
        self.note = ""
        if state is State.VERIFYING:
            self.done = 0
        if reason is not None:
            self.reason = reason
        if path is not None:
            self.path = path
        self._emit()

    def fail(self, reason: str) -> None:
        if not self.finished:
            self.move(State.FAILED, reason=reason)

    def say(self, note: str) -> None:
        """Tell the watcher why the job is not moving (cleared by the next state)."""
        self.note = note
        self._emit()

    def add_bytes(self, n: int) -> None:
        self.done += n
        self._emit()

    def _emit(self) -> None:
        if self.on_event is not None:
            self.on_event(
                DownloadEvent(self.label, self.state, self.done, self.total, self.file, self.reason, self.path,
                              tuple(self.warnings), time.monotonic() - self._t0, self.fit,
                              self.note)
            )
