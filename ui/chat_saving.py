"""Saving the shown chat without blocking the window: a snapshot is taken here, on the GUI thread, and the
store's writer thread writes it (app/conversations.py save_later); what became of it comes back as a signal.
A write the system refuses (a full disk) shows a notice and is tried again every SAVE_RETRY_MS; switching
chats and quitting wait for the writes and say whether the chat is on disk.

A mixin of ChatPanel (ui/chat_panel.py), which owns the conversation, the store and the notice.
"""
from __future__ import annotations

import logging
import os
import time

from PySide6.QtCore import QObject, QTimer, Signal, Slot

from app.conversations import apply_written, snapshot

log = logging.getLogger(__name__)

SAVE_EVERY_S = 0.5  # while an answer streams, it is saved this often
SAVE_RETRY_MS = 5000  # while a chat could not be written (a full disk), it is tried again this often


class WriteNews(QObject):
    """Carries a write's outcome from the writer thread to the GUI thread (a queued signal)."""
    written = Signal(int, object, object, object)  # save number, Snapshot, Written | None, error | None


class ChatSaving:
    def _init_saving(self) -> None:
        self.save_error: str = ""  # why the shown chat is not on disk yet ("" when it is)
        self._last_save = 0.0
        self._saves = 0  # each save's number, so an older write's news never undoes a newer one's
        self._applied = 0  # the newest save whose outcome was applied
        self._latest = None  # the newest outcome (set on the writer thread; read once writes are flushed)
        self._news = WriteNews(self)
        self._news.written.connect(self._on_written)
        self._save_retry = QTimer(self)
        self._save_retry.setInterval(SAVE_RETRY_MS)
        self._save_retry.timeout.connect(self.save)

    @Slot()
    def save(self) -> bool:
        """Hand a snapshot of the shown chat to the writer thread and return at once; False while its last
        write failed (the notice says why: the chat stays in this window and is written again every few
        seconds, on each change and at quit)."""
        if not (self.conv.messages or self.conv.documents):
            return True
        self._last_save = time.monotonic()  # a failed write waits as long as a good one before the next try
        self._saves += 1
        news, number = self._news, self._saves

        def done(snap, written, error) -> None:  # on the writer thread
            self._latest = (number, snap, written, error)
            news.written.emit(number, snap, written, error)

        self.store.save_later(snapshot(self.conv), done)
        return not self.save_error

    def save_now(self) -> bool:
        """Save the shown chat and wait until it is written (switching chats, quitting): False, with the
        notice, when it could not be."""
        self.save()
        self.store.flush()  # one chat's file, small: a document's text was written once, when it was attached
        if self._latest is not None:
            self._on_written(*self._latest)
        return not self.save_error

    def saves_pending(self) -> bool:
        return self.store.pending()

    @Slot(int, object, object, object)
    def _on_written(self, number: int, snap, written, error) -> None:
        if number <= self._applied:
            return  # news of an older write, after a newer one's
        self._applied = number
        if error is None:
            renamed = written.id != snap.id
            if apply_written(self.conv, snap, written) and renamed:
                self.conversation_changed.emit(self.conv)  # saved as a copy: the list shows its new name
            if self.save_error:
                self.save_error = ""
                self._save_retry.stop()
                self._notice("")
            return
        reason = os.strerror(error.errno) if getattr(error, "errno", None) else str(error)
        if snap.lineage != self.conv.__dict__.get("lineage"):  # a chat no longer shown (switching waits for
            log.warning("chat %s could not be saved: %s", snap.id, error)  # its writes: a race at most)
            return
        if not self.save_error:
            log.warning("chat %s could not be saved: %s", snap.id, error)
        self.save_error = (f"This chat could not be saved ({reason}). It is kept in this window and saved "
                           "as soon as it can be: free some disk space, or check the data folder's permissions.")
        self._notice(self.save_error)
        self._save_retry.start()
