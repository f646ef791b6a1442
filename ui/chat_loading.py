"""Opening a chat and listing the chats without the GUI thread waiting on a disk (issue 65): the chat shows at once,
as loading; the store's writer thread reads its chat file, then its documents' side files (app/conversation_reading.py),
and what it read comes back through a plain queue the GUI thread takes in on a timer (the writer thread holds
no Qt object: one freed there deadlocks Qt). Send, attaching and the count wait until the texts are there.

A mixin of ChatPanel (ui/chat_panel.py), which owns the conversation, the store, the view and the buttons.
"""
from __future__ import annotations

import logging
import queue
from typing import Sequence

from PySide6.QtCore import QTimer, Slot

from app.conversation_reading import fill_texts, guarded, list_chats, open_chat
from app.conversations import Conversation

log = logging.getLogger(__name__)

LOADING_CHAT = "Loading the chat…"
LOADING_DOCUMENTS = "Loading the document {names}…"
READ_NEWS_EVERY_MS = 30  # while a read is out, what it read is taken in this often


class ChatLoading:
    def _init_loading(self) -> None:
        self.loading: str = ""  # what the shown chat still waits for, said as the document bar says it ("": none)
        self._reads = 0  # each read's number, so that news of one asked before the latest is dropped
        self._open_number = 0  # the open whose news is awaited (0: none)
        self._list_number = 0  # the listing whose news is awaited (0: none)
        # The writer thread's news, in a plain queue: that thread must never hold a Qt object (ui/chat_saving.py).
        self._read_news: queue.SimpleQueue = queue.SimpleQueue()
        self._read_timer = QTimer(self)
        self._read_timer.setInterval(READ_NEWS_EVERY_MS)
        self._read_timer.timeout.connect(self._take_read_news)

    def open_conversation(self, conv_ids: Sequence[str], title: str = "") -> bool:
        """Show chat conv_ids[0] at once, as loading (`title` from the list), and read it on the writer thread;
        when it cannot be read, the next of `conv_ids` (the window's start: the latest chat that reads). False
        when the shown chat may not be left yet (an answer streams, or it could not be saved)."""
        if not conv_ids or not self.may_switch():
            return False
        store, ids = self.store, list(conv_ids)
        self.show_conversation(Conversation(id=ids[0], title=title or "Chat"), loading=LOADING_CHAT)
        self._open_number = self._read_later("open", lambda tell: open_chat(store, ids, tell))
        return True

    def list_conversations(self) -> None:
        """Read each chat's summary on the writer thread; `summaries_read` gives them (newest first)."""
        store = self.store
        self._list_number = self._read_later("list", lambda tell: list_chats(store, tell))

    def show_conversation(self, conv: Conversation, loading: str = "") -> None:
        """`conv` in the view; `loading` (what it waits for, said in the document bar) keeps Send off."""
        self.conv, self.loading = conv, loading
        self.view.clear()
        for m in conv.messages:
            self._decorate(self.view.add(m.role, m.content), m)
        self._show_document()
        self.request_count()
        self._update_buttons()

    def reading(self) -> bool:
        """A read of the chats (an open, a listing) is out and its news not all taken in."""
        return bool(self._open_number or self._list_number)

    def forget_opening(self) -> None:
        """The chat being opened is not wanted any more (another one is shown): its news is dropped."""
        self._open_number = 0

    def _read_later(self, name: str, job) -> int:
        self._reads += 1
        number, news = self._reads, self._read_news
        self.store.read_later(name, guarded(job, lambda what: news.put((number, *what))))
        self._read_timer.start()
        return number

    @Slot()
    def _take_read_news(self) -> None:
        while True:
            try:
                number, what, value = self._read_news.get_nowait()
            except queue.Empty:
                break
            if number == self._list_number:
                self._list_number = 0
                if what == "summaries":
                    self.summaries_read.emit(value)
                else:
                    log.warning("the chats could not be listed: %s", value)
            elif number == self._open_number:
                self._on_opened(what, value)
        if not self.reading():
            self._read_timer.stop()

    def _on_opened(self, what: str, value) -> None:
        if what == "chat":
            asked = self.conv.id
            names = ", ".join(d.name for d in value.documents if d.text_file)
            self.show_conversation(value, loading=LOADING_DOCUMENTS.format(names=names) if names else LOADING_CHAT)
            if value.id != asked:  # the first asked could not be read: the list selects the one shown
                self.conversation_changed.emit(value)
            return
        self._open_number = 0
        if what == "texts":
            fill_texts(self.conv, value)
            self._loaded()
            return
        self.show_conversation(Conversation())
        self._notice(f"This chat could not be opened: {value}.")
        self.open_failed.emit(value)

    def _loaded(self) -> None:
        """The shown chat's texts are all there: its sources' chips, its document, its count, Send."""
        self.loading = ""
        for i, m in enumerate(self.conv.messages):
            if m.sources:  # a chip names its paragraph, found in the text
                self._decorate(self.view.widget_at(i), m)
        self._show_document()
        self.request_count()
        self._update_buttons()
        if self.unsaved_while_loading:
            self.save()
