"""One background thread that writes what it is given, in order, and coalesces: a later item put under the
same key replaces one not written yet (the latest snapshot of a conversation wins). Qt-free: the chat panel
hears of each write through the `done` callback, called on this thread (ui/chat_saving.py posts it on).
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Hashable

log = logging.getLogger(__name__)

LINGER_S = 5.0  # the thread waits this long for more before it ends: a streamed answer's saves reuse it

# done(item, result, error): error is None when write(item) returned `result`, else what it raised
Done = Callable[[Any, Any, BaseException | None], None]


class CoalescingWriter:
    def __init__(self, write: Callable[[Any], Any], name: str = "writer"):
        self._write, self._name = write, name
        self._cond = threading.Condition()
        self._pending: dict[Hashable, tuple[Any, Done | None]] = {}  # oldest first
        self._writing: Hashable | None = None  # the key being written now
        self._thread: threading.Thread | None = None

    def put(self, key: Hashable, item: Any, done: Done | None = None) -> None:
        """Write `item` soon, on the writer thread; one under `key` not started yet is dropped for it."""
        with self._cond:
            self._pending.pop(key, None)
            self._pending[key] = (item, done)
            self._cond.notify_all()
            if self._thread is None:  # the thread ends once idle a while: no idle thread per store
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()

    def pending(self, which: Callable[[Hashable], bool] | None = None) -> bool:
        """Something (under a key `which` picks; None: anything) is waiting or being written."""
        with self._cond:
            return self._busy(which)

    def wait(self, which: Callable[[Hashable], bool] | None = None, timeout: float | None = None) -> bool:
        """Until what was put (under the keys `which` picks) is written and its `done` called; False when
        `timeout` ran out first."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._busy(which), timeout)

    def _busy(self, which: Callable[[Hashable], bool] | None) -> bool:
        keys = [*self._pending, *([self._writing] if self._writing is not None else [])]
        return any(which is None or which(k) for k in keys)

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._pending:
                    self._cond.notify_all()
                    self._cond.wait_for(lambda: bool(self._pending), LINGER_S)
                if not self._pending:
                    self._thread = None
                    return
                key = next(iter(self._pending))
                item, done = self._pending.pop(key)
                self._writing = key
            result, error = None, None
            try:
                result = self._write(item)
            except BaseException as exc:  # a full disk, or a bug: either way the caller must hear of it
                if not isinstance(exc, OSError):
                    log.exception("%s: writing %s failed", self._name, key)
                error = exc
            try:
                if done is not None:
                    done(item, result, error)
            except Exception:  # a receiver gone (a closed window): the write itself is done
                log.debug("%s: the callback for %s failed", self._name, key, exc_info=True)
            with self._cond:
                self._writing = None
                self._cond.notify_all()
