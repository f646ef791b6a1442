"""Saving the shown chat without blocking the window: a snapshot is taken here, on the GUI thread, and the
store's writer thread writes it (app/conversations.py save_later); what became of it comes back through a plain
queue the GUI thread takes in (the writer thread holds no Qt object: one freed there deadlocks Qt).
A write the system refuses (a full disk) shows a notice and is tried again every SAVE_RETRY_MS. Switching
chats hands the latest snapshot to the writer and goes on (the chat read next waits behind it on the same
thread); a chat left before its write failed is kept here, told and tried again. Quitting waits for the
writes and says whether every chat is on disk. Only a chat whose write already failed is saved before it
may be left.

A mixin of ChatPanel (ui/chat_panel.py), which owns the conversation, the store and the notice.
"""
from __future__ import annotations

import logging
import os
import queue
import time

from PySide6.QtCore import QTimer, Slot

from app.conversations import apply_written, snapshot

log = logging.getLogger(__name__)

SAVE_EVERY_S = 0.5  # while an answer streams, it is saved this often
SAVE_RETRY_MS = 5000  # while a chat could not be written (a full disk), it is tried again this often
NEWS_EVERY_MS = 100  # while writes are out, their outcomes are taken in this often


class ChatSaving:
    def _init_saving(self) -> None:
        self.save_error: str = ""  # why the shown chat is not on disk yet ("" when it is)
        self._last_save = 0.0
        self.unsaved_while_loading = False  # a change came while the shown chat's texts were read: saved after
        self._saves = 0  # each save's number, so an older write's news never undoes a newer one's
        self._applied = 0  # the newest save whose outcome was applied
        # The writer thread's news, in a plain queue: that thread must never hold a Qt object, for the last
        # reference it drops would destroy the object there, and Qt then deadlocks with the GUI thread.
        self._outcomes: queue.SimpleQueue = queue.SimpleQueue()
        self._left_unsaved: dict = {}  # lineage -> (snapshot, why) of a chat left before its write succeeded
        self._news_timer = QTimer(self)
        self._news_timer.setInterval(NEWS_EVERY_MS)
        self._news_timer.timeout.connect(self._take_news)
        self._save_retry = QTimer(self)
        self._save_retry.setInterval(SAVE_RETRY_MS)
        self._save_retry.timeout.connect(self._retry)

    @Slot()
    def save(self) -> bool:
        """Hand a snapshot of the shown chat to the writer thread and return at once; False while its last
        write failed (the notice says why: the chat stays in this window and is written again every few
        seconds, on each change and at quit)."""
        if not (self.conv.messages or self.conv.documents):
            return True
        if self.loading:  # its documents' texts are not read yet (ui/chat_loading.py): saved once they are
            self.unsaved_while_loading = True
            return not self.save_error
        self.unsaved_while_loading = False
        self._last_save = time.monotonic()  # a failed write waits as long as a good one before the next try
        self._write(snapshot(self.conv))
        return not self.save_error

    def _write(self, snap) -> None:
        self._saves += 1
        outcomes, number = self._outcomes, self._saves

        def done(snap, written, error) -> None:  # on the writer thread: plain Python only
            outcomes.put((number, snap, written, error))

        self.store.save_later(snap, done)
        self._news_timer.start()

    @Slot()
    def _retry(self) -> None:
        for snap, _ in list(self._left_unsaved.values()):
            self._write(snap)
        self.save()

    def save_now(self) -> bool:
        """Save the shown chat, and any left one not on disk yet, and wait until they are written (quitting):
        False, with the notice, when one could not be."""
        self.save()
        for snap, _ in list(self._left_unsaved.values()):
            self._write(snap)
        self.store.flush()  # chats' files, small: a document's text was written once, when it was attached
        self._take_news()
        return not (self.save_error or self._left_unsaved)

    def leave_saved(self) -> bool:
        """The shown chat may be left as far as saving goes: its latest snapshot is handed to the writer (not
        waited for); one whose write already failed is written first, and False when it still cannot be."""
        if self.save_error:
            self.save_now()
            return not self.save_error  # (a left chat still unsaved is kept and tried again: no reason to stay)
        if self.store.pending():
            self.save()
        return True

    @Slot()
    def _take_news(self) -> None:
        """The writes' outcomes, on the GUI thread, in the order they were written."""
        while True:
            try:
                news = self._outcomes.get_nowait()
            except queue.Empty:
                break
            self._on_written(*news)
        if not self.store.pending() and self._outcomes.empty():
            self._news_timer.stop()

    def unsaved_notice(self) -> str:
        """Why some chat is not on disk ("" when every one is): the shown chat's trouble, else a left one's."""
        return self.save_error or self._left_notice()

    def saves_pending(self) -> bool:
        return self.store.pending()

    def _on_written(self, number: int, snap, written, error) -> None:
        if snap.lineage != self.conv.__dict__.get("lineage"):
            self._on_left_written(snap, error)
            return
        if number <= self._applied:
            return  # news of an older write, after a newer one's
        self._applied = number
        if error is None:
            renamed = written.id != snap.id
            if apply_written(self.conv, snap, written) and renamed:
                self.conversation_changed.emit(self.conv)  # saved as a copy: the list shows its new name
            if self.save_error:
                self.save_error = ""
                self._notice(self._left_notice())
                if not self._left_unsaved:
                    self._save_retry.stop()
            return
        reason = _reason(error)
        if not self.save_error:
            log.warning("chat %s could not be saved: %s", snap.id, error)
        self.save_error = (f"This chat could not be saved ({reason}). It is kept in this window and saved "
                           "as soon as it can be: free some disk space, or check the data folder's permissions.")
        self._notice(self.save_error)
        self._save_retry.start()

    def _on_left_written(self, snap, error) -> None:
        """News of a chat no longer shown: kept here, told and tried again until its write succeeds."""
        if error is None:
            if self._left_unsaved.pop(snap.lineage, None) is not None:
                self._notice(self.save_error or self._left_notice())  # the shown chat's own trouble first
                if not (self.save_error or self._left_unsaved):
                    self._save_retry.stop()
            return
        log.warning("chat %s could not be saved: %s", snap.id, error)
        self._left_unsaved[snap.lineage] = (snap, _reason(error))
        if not self.save_error:
            self._notice(self._left_notice())
        self._save_retry.start()

    def _left_notice(self) -> str:
        """What the window says of the chats left before they were written ("" when there are none)."""
        if not self._left_unsaved:
            return ""
        snap, reason = next(reversed(self._left_unsaved.values()))
        more = f" (and {len(self._left_unsaved) - 1} more)" if len(self._left_unsaved) > 1 else ""
        return (f"The chat \u201c{snap.title}\u201d{more} could not be saved ({reason}). It is kept in this window's "
                "memory and saved as soon as it can be: free some disk space, or check the data folder's permissions.")


def _reason(error) -> str:
    return os.strerror(error.errno) if getattr(error, "errno", None) else str(error)
