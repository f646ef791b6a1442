"""The chat tab: document bar, conversation, input, prefill progress, and the document pane beside them.

What is asked of the engine comes from app/chat_session.py (the conversation as turns, the request);
requests go to the engine client; each answer's events stream back to this panel's own callbacks and
into the last message, and Stop cancels this panel's answer only. The conversation is saved after
every message and every half second while an answer streams, written off the GUI thread (ui/chat_saving.py).
Attaching and removing documents, and showing an answer's sources in the pane, are ui/chat_documents.py's;
counting the prompt's tokens as it is typed is ui/chat_count.py's.
"""
from __future__ import annotations

import logging
import time

from PySide6.QtCore import QTimer, Signal, Slot
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app import chat_session
from app.conversations import Conversation, ConversationStore, Message
from app.engine_client import EngineClient, TaskClient, TaskHandle
from app.engine_protocol import CountResult, TaskKind
from backend.protocol import DEFAULT_MAX_TOKENS, CompletionRequest, CompletionResult, ProgressEvent, TokenEvent
from backend.sampling import GREEDY, SamplingParams
from backend.stopping import LOOP_NOTE
from ui.background import BackgroundJobs
from ui.chat_count import ChatCount
from ui.chat_documents import NO_DOCUMENT, ChatDocuments
from ui.chat_loading import ChatLoading
from ui.chat_saving import SAVE_EVERY_S, SAVE_RETRY_MS, ChatSaving  # noqa: F401 (SAVE_RETRY_MS: said here before)
from ui.chat_view import ChatView
from ui.controls import RidgeFillControls
from ui.document_pane import DocumentPane
from ui.format import eta_line, message_lines
from ui.ttft_chart import TtftChart

log = logging.getLogger(__name__)

COUNT_AFTER_MS = 400  # typing pauses this long before the prompt is counted again


class ChatPanel(ChatDocuments, ChatCount, ChatSaving, ChatLoading, QWidget):
    conversation_changed = Signal(object)  # Conversation (title or content changed)
    summaries_read = Signal(list)  # list_conversations read each chat's Summary (newest first)
    open_failed = Signal(str)  # open_conversation could not read the chat (why): a new chat is shown
    busy_changed = Signal(bool)  # an answer is being produced or documents read (switching conversations waits)
    documents_read = Signal(bool)  # an attach_documents ended: True when one or more documents were attached

    def __init__(self, service: EngineClient, store: ConversationStore, controls: RidgeFillControls,
                 chart: TtftChart, max_tokens: int = DEFAULT_MAX_TOKENS, parent=None):
        super().__init__(parent)
        self.service, self.store, self.controls, self.chart = service, store, controls, chart
        self.max_tokens = max_tokens
        self.engine: EngineClient | TaskClient = service  # who answers: the engine child or a server (engine_picker)
        self.remote = None  # app/remote_engine.RemoteEngine while a server answers
        self.sampling: SamplingParams = GREEDY  # the Generation section's (the main window sets both)
        self.conv = Conversation()
        self.too_long: str = ""  # the limit message while the prompt does not fit
        self.last_count: CountResult | None = None
        self._task_primary: TaskHandle | None = None  # the answer
        self._task_exact: TaskHandle | None = None  # the exact run for comparison
        self._task_count: TaskHandle | None = None
        self._reading: TaskHandle | None = None  # documents being read (ui/chat_documents.py)
        self.jobs = BackgroundJobs(self)
        self._answer: Message | None = None
        self._answer_widget = None
        self._exact_text: list[str] = []
        self._init_saving()
        self._init_loading()
        self._progress_base: tuple[int, float] | None = None
        self.setAcceptDrops(True)
        self._build_widgets()
        self._lay_out()
        self._connect()

    def _build_widgets(self) -> None:
        self.attach_btn = QPushButton("Attach files…")
        self.folder_btn = QPushButton("Attach folder…")
        self.doc_label = QLabel(NO_DOCUMENT)
        self.doc_label.setWordWrap(True)
        self.pane = DocumentPane()
        self.count_label = QLabel()
        self.count_label.setWordWrap(True)
        self.view = ChatView()
        self.input = QPlainTextEdit()
        self.input.setPlaceholderText("Ask about the document…  (Ctrl+Enter sends)")
        self.input.setMaximumHeight(80)
        self.send_btn = QPushButton("Send")
        self.send_btn.setDefault(True)
        self.stop_btn = QPushButton("Stop")
        self.stop_btn.setEnabled(False)
        self.progress = QProgressBar()
        self.progress.setVisible(False)
        self.progress_label = QLabel()
        self.progress_label.setVisible(False)
        self.notice = QLabel()
        self.notice.setWordWrap(True)
        self.notice.setVisible(False)
        self.notice.setStyleSheet("color: #c62828")

    def _lay_out(self) -> None:
        doc_row = QHBoxLayout()
        doc_row.addWidget(self.attach_btn)
        doc_row.addWidget(self.folder_btn)
        doc_row.addWidget(self.doc_label, 1)
        buttons = QVBoxLayout()
        buttons.addWidget(self.send_btn)
        buttons.addWidget(self.stop_btn)
        input_row = QHBoxLayout()
        input_row.addWidget(self.input, 1)
        input_row.addLayout(buttons)
        chat = QWidget()
        lay = QVBoxLayout(chat)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addLayout(doc_row)
        lay.addWidget(self.count_label)
        lay.addWidget(self.notice)
        lay.addWidget(self.view, 1)
        lay.addWidget(self.progress)
        lay.addWidget(self.progress_label)
        lay.addLayout(input_row)
        split = QSplitter()
        split.addWidget(chat)
        split.addWidget(self.pane)
        split.setStretchFactor(0, 1)
        split.setStretchFactor(1, 1)
        QVBoxLayout(self).addWidget(split)

    def _connect(self) -> None:
        self._count_timer = QTimer(self)
        self._count_timer.setSingleShot(True)
        self._count_timer.setInterval(COUNT_AFTER_MS)
        self._count_timer.timeout.connect(self.request_count)
        self.attach_btn.clicked.connect(self.choose_document)
        self.folder_btn.clicked.connect(self.choose_folder)
        self.pane.remove_requested.connect(self.remove_document)
        self.send_btn.clicked.connect(self.send)
        self.stop_btn.clicked.connect(self.stop)
        self.input.textChanged.connect(self._count_timer.start)
        QShortcut(QKeySequence("Ctrl+Return"), self, self.send)
        # A bound slot, not a lambda: Qt drops it when this widget is deleted before the service.
        self.service.ready.connect(self._on_engine_ready)
        self.service.document_changed.connect(self.apply_check)

    # ---- conversation ----------------------------------------------------------------------------
    def load_conversation(self, conv: Conversation) -> bool:
        """Show `conv`, read already (open_conversation reads a saved one off the GUI thread)."""
        if not self.may_switch():
            return False
        self.forget_opening()
        self.show_conversation(conv)
        return True

    def may_switch(self) -> bool:
        """The shown chat may be left: no answer streams, and it is on disk (the notice says why not)."""
        if self.busy():  # the answer in progress belongs to the shown conversation: stop first
            self._notice("Stop or wait for the answer before switching conversations.")
            return False
        # the shown chat goes to the writer; one that could not be written is not dropped before it is
        return self.leave_saved()

    def new_conversation(self) -> Conversation:
        self.load_conversation(Conversation())
        return self.conv

    def _decorate(self, w, m: Message) -> None:
        meta, beside_exact = message_lines(m)
        w.set_meta(meta)
        w.set_chips(self.sources_chips(m.sources, m.exact_spans) if m.sources and not self.loading else None)
        if beside_exact:
            w.set_exact(beside_exact)

    @Slot(object)
    def apply_check(self, status) -> None:
        """Mark the answer the engine checked against exact's, or show exact's instead (chat_session.apply_check)."""
        m = chat_session.apply_check(self.conv, status.answer_check) if status.answer_check else None
        w = None if m is None else self.view.widget_at(next(i for i, x in enumerate(self.conv.messages) if x is m))
        if w is not None:
            w.set_text(m.content)
            self._decorate(w, m)
            self.save()

    @Slot(object)
    def _on_engine_ready(self, _info) -> None:
        self.request_count()

    # ---- requests --------------------------------------------------------------------------------
    def build_request(self, question: str, **over) -> CompletionRequest:
        """The request for `question` with the RidgeFill controls' mode, split and tail as they are now,
        unless `over` gives others (the exact run of a comparison: mode="off")."""
        c = self.controls
        now = {"mode": c.mode(), "split": c.asked_split(), "tail": c.asked_tail(), "max_tokens": self.max_tokens}
        return chat_session.build_request(self.conv, question, **{**now, **over})

    def busy(self) -> bool:
        return self._task_primary is not None or self._task_exact is not None or self._reading is not None

    def _update_buttons(self) -> None:
        busy = self.busy()
        self.send_btn.setEnabled(not busy and not self.too_long and not self.loading)
        self.stop_btn.setEnabled(busy)
        for b in (self.attach_btn, self.folder_btn, self.pane.remove_btn):
            b.setEnabled(not busy and not self.loading)
        if busy != getattr(self, "_was_busy", False):
            self._was_busy = busy
            self.busy_changed.emit(busy)

    @Slot()
    def send(self) -> bool:
        question = self.input.toPlainText().strip()
        if not question or self.busy() or self.loading:  # the documents' texts are not read yet
            return False
        if self.too_long:
            self._notice(self.too_long)
            return False
        compare = self.controls.compare.isChecked() and self.controls.compare.isEnabled()  # greyed: a server without
        # Both runs draw with one seed, so "answers agree" still compares the prefills; a loop is cut short.
        drawn = {"sampling": self.sampling.with_seed(), "stop_loops": True}
        drawn["frame_documents"] = False  # the documents go apart, by reference: the engine child frames them in
        # With compare on, neither run reuses a cached prefix, so the two TTFTs measure the same work.
        primary = self.build_request(question, **drawn, **({"reuse_prefix": False} if compare else {}))
        # The exact run's sources are not shown: it does not look for any.
        exact = (self.build_request(question, mode="off", split=None, tail=None, reuse_prefix=False,
                                    documents=None, **drawn) if compare else None)
        self._notice("")
        self.input.clear()
        self._count_timer.stop()  # not counted while it streams (a long document's prompt takes long to build):
        self._answer = chat_session.ask(self.conv, question)  # the answer's end counts the next one
        self.save()
        self.view.add("user", question)
        self._answer_widget = self.view.add("assistant", "")
        self._answer_widget.set_meta("waiting for the engine…")
        self._exact_text = []
        self._task_primary = self._submit_answer(primary)
        self._task_exact = self._submit_answer(exact) if exact else None
        self._progress_base = None
        self._update_buttons()
        self.conversation_changed.emit(self.conv)
        return True

    def _submit_answer(self, req: CompletionRequest) -> TaskHandle:
        h = self.engine.submit(TaskKind.COMPLETE, req, owner=self,
                                on_event=lambda ev: self._on_event(h, ev),
                                on_done=lambda res: self._on_result(h, res),
                                on_failed=lambda etype, message: self._on_failed(h, etype, message),
                                on_cancelled=lambda message: self._on_cancelled(h, message))
        return h

    @Slot()
    def stop(self) -> None:
        """Stop this chat's answer (and its exact run), or its reading of documents; other tasks (a recall, a
        map fit) go on."""
        for h in (self._task_primary, self._task_exact):
            if h is not None:
                h.cancel()
        self.stop_reading()

    # ---- engine events (each for a task of this panel) -------------------------------------------
    def _on_event(self, h: TaskHandle, ev) -> None:
        if h is not self._task_primary and h is not self._task_exact:
            return
        label = "exact run" if h is self._task_exact else "prefill"
        if isinstance(ev, ProgressEvent):
            if self._progress_base is None or ev.done < self._progress_base[0]:
                self._progress_base = (ev.done, ev.elapsed_ms)
                rate = ev.done / (ev.elapsed_ms / 1000) if ev.elapsed_ms > 0 else 0.0
            else:
                d0, t0 = self._progress_base
                dt = (ev.elapsed_ms - t0) / 1000
                rate = (ev.done - d0) / dt if dt > 0 else 0.0
            self.progress.setVisible(True)
            self.progress_label.setVisible(True)
            self.progress.setRange(0, max(1, ev.total))
            self.progress.setValue(ev.done)
            self.progress_label.setText(eta_line(ev.done, ev.total, rate, label))
            if ev.done >= ev.total:
                self._progress_base = None
        elif isinstance(ev, TokenEvent):
            self.progress.setVisible(False)
            self.progress_label.setVisible(False)
            if h is self._task_primary and self._answer is not None:
                self._answer.content += ev.text
                self._answer_widget.append(ev.text)
                self._answer_widget.set_meta("answering…")
                if time.monotonic() - self._last_save > SAVE_EVERY_S:
                    self.save()
            else:
                self._exact_text.append(ev.text)
                self._answer_widget.set_exact("exact model answering… " + "".join(self._exact_text)[-80:])

    def _on_result(self, h: TaskHandle, res: CompletionResult) -> None:
        if h is not self._task_primary and h is not self._task_exact:
            return
        t = {**res.timings.as_dict(), **getattr(res, "extra", {})}  # a server's answer: who, its own timings
        if h is self._task_primary:
            self._task_primary = None
            self._answer.content = res.text
            self._answer.timings = t
            self._answer.complete = True
            self._answer.sources = [s.as_dict() for s in res.sources] or None
            self._answer.exact_spans = [s.as_dict() for s in res.exact_spans] or None
            self.show_exact_spans(self._answer.exact_spans)
            if res.finish_reason == "cancelled":
                self._answer.note = "stopped by you"
            elif res.finish_reason == "loop":
                self._answer.note = LOOP_NOTE
            self._answer_widget.set_text(res.text)
            self.chart.add(chat_session.answer_count(self.conv), res.timings.ttft_ms, res.timings.mode)
        else:
            self._task_exact = None
            self._answer.exact = {"content": res.text, "timings": t}
            if res.finish_reason == "loop":
                self._answer.note = (self._answer.note + "\n" if self._answer.note else "") + "exact run " + LOOP_NOTE
            self.chart.add(chat_session.answer_count(self.conv), res.timings.ttft_ms, "off")
        self._decorate(self._answer_widget, self._answer)
        if self._task_exact is not None and self._task_primary is None:
            self._answer_widget.set_exact("running the exact model for comparison…")
        self._finish_if_done()

    def _on_cancelled(self, h: TaskHandle, message: str) -> None:
        if h is not self._task_primary and h is not self._task_exact:
            return
        if h is self._task_primary:
            self._task_primary = None
            self._answer.complete = True
            self._answer.note = "stopped by you during prompt processing"
        else:
            self._task_exact = None
        self._decorate(self._answer_widget, self._answer)
        self._finish_if_done()

    def _on_failed(self, h: TaskHandle, etype: str, message: str) -> None:
        if h is not self._task_primary and h is not self._task_exact:
            return
        if h is self._task_primary:
            self._task_primary = None
            self._answer.note = message
            if etype == "DocumentTooLongError":
                self.too_long = message
            if etype in ("DocumentTooLongError", "RemoteError"):  # a server's error says what to do
                self._notice(message)
        else:
            self._task_exact = None
            self._answer.note = (self._answer.note + "\n" if self._answer.note else "") + f"exact run failed: {message}"
        self._decorate(self._answer_widget, self._answer)
        self._finish_if_done()

    def _finish_if_done(self) -> None:
        self.save()
        if not self.busy():
            self.progress.setVisible(False)
            self.progress_label.setVisible(False)
            self.conversation_changed.emit(self.conv)
            self.request_count()
        self._update_buttons()

    def shutdown(self) -> None:
        """Save the conversation and wait for its writes; stop a reading of documents (on quit)."""
        try:
            self.save_now()
        finally:
            self._save_retry.stop()  # a write that failed just now is not tried again after quitting
            self.jobs.shutdown()

    def _notice(self, text: str) -> None:
        self.notice.setText(text)
        self.notice.setVisible(bool(text))

    def show_notice(self, text: str) -> None:
        """The red line above the conversation, for what the window must say (a config file set aside)."""
        self._notice(text)

