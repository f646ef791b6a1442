"""The chat's documents: attaching files (several at once) and folders, by dialog or drop, removing one,
and the notes that say so in the chat; the document pane shows them and an answer's sources in them.

A mixin of ChatPanel (ui/chat_panel.py), which owns the conversation, the view and the pane.
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Slot
from PySide6.QtWidgets import QFileDialog

from app import chat_session
from app.engine_client import TaskHandle
from backend.documents import DOCUMENT_SUFFIXES, DocumentText, read_documents
from backend.errors import Cancelled, DocumentError
from ui.source_chips import SourceChips

DOC_SUFFIXES = set(DOCUMENT_SUFFIXES)  # text, .pdf, .docx, .html/.htm/.xhtml, .epub, .odt
DOC_FILTER = f"Documents ({' '.join('*' + s for s in DOCUMENT_SUFFIXES)});;All files (*)"
NO_DOCUMENT = ("No document: attach text, PDF, Word (.docx), web page, e-book (.epub) or .odt files, "
               "or a folder of them, or drop them here.")


def read_each(paths, stopped=lambda: False) -> tuple[list[tuple[Path, DocumentText]], list[str]]:
    """Each path's documents with the file each came from (a folder gives its readable files), and one
    message per path that could not be read: one bad file does not keep the others out. `stopped()` is
    asked before each path and inside each reading (between parts, pages and elements); True ends the
    reading with Cancelled."""
    found, errors = [], []
    for path in map(Path, paths):
        if stopped():
            raise Cancelled("stopped reading")
        try:
            docs = read_documents([path], cancelled=stopped)
        except DocumentError as exc:
            errors.append(str(exc))
            continue
        found += [(path / d.name if path.is_dir() else path, d) for d in docs]
    return found, errors


class ChatDocuments:
    """What ChatPanel does with documents (it provides conv, view, pane, doc_label and the rest)."""

    @Slot()
    def choose_document(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Attach documents", "", DOC_FILTER)
        if paths:
            self.attach_documents(paths)

    @Slot()
    def choose_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Attach the documents in a folder")
        if folder:
            self.attach_documents([folder])

    def attach_document(self, path: str | Path) -> bool:
        return self.attach_documents([path])

    def attach_documents(self, paths) -> bool:
        """Read `paths` on a worker thread (a long PDF takes seconds: the window stays live, and Stop stops
        waiting), then attach what could be read after the documents already there; a notice names what
        could not be read and what was attached already, and `documents_read` says whether one or more were
        attached. False when nothing was started: no paths, or an answer or a reading is under way."""
        paths = [Path(p) for p in paths]
        if not paths or self.busy() or self.loading:
            return False
        self._notice("")
        self.doc_label.setText(f"Reading {', '.join(p.name for p in paths)}…")
        h = self.jobs.submit("read documents", lambda ctx: read_each(paths, lambda: ctx.cancelled), owner=self,
                             on_done=lambda read: self._read(h, *read),
                             on_failed=lambda etype, message: self._read(h, [], [f"Not read ({etype}): {message}"]),
                             on_cancelled=lambda _message: self._read(h, [], []))
        self._reading = h
        self._update_buttons()
        return True

    def stop_reading(self) -> None:
        """Stop waiting for the documents being read: nothing of them is attached."""
        if self._reading is not None:
            self._reading.cancel()
            self._read(self._reading, [], ["Stopped reading: nothing was attached."])

    def _read(self, h: TaskHandle, found: list, errors: list[str]) -> None:
        if h is not self._reading:
            return  # a reading stopped before it ended
        self._reading = None
        added = self._attach_found(found, errors)
        self._show_document()
        self._update_buttons()
        self.documents_read.emit(added)

    def _attach_found(self, found: list, errors: list[str]) -> bool:
        have = {(d.name, d.text) for d in self.conv.documents}
        added = []
        for path, doc in found:
            if (doc.name, doc.text) in have:
                errors.append(f"{doc.name} is attached already.")
                continue
            have.add((doc.name, doc.text))
            added.append(chat_session.attach(self.conv, path, doc))
        self._notice(" ".join(errors))
        if not added:
            return False
        note = chat_session.note_added(self.conv, added)
        if note is not None:
            self.view.add(note.role, note.content)
        self._documents_changed()
        return True

    def remove_document(self, index: int) -> None:
        """Take document `index` out of the chat; the next answer reads the others (a note says so)."""
        if self.busy() or self.loading or not 0 <= index < len(self.conv.documents):
            return
        chat_session.remove(self.conv, index)
        self.view.add("note", self.conv.messages[-1].content)
        self._documents_changed()

    def _documents_changed(self) -> None:
        self.save()
        self._show_document()
        self.request_count()
        self.conversation_changed.emit(self.conv)

    def _show_document(self) -> None:
        docs = self.conv.documents
        if self.loading:  # their texts are not read yet
            self.doc_label.setText(self.loading)
            self.pane.setVisible(False)
            return
        if not docs:
            self.doc_label.setText(NO_DOCUMENT)
        elif len(docs) == 1:
            self.doc_label.setText(f"Document: {docs[0].name} · {len(docs[0].text):,} characters")
        else:
            self.doc_label.setText(f"{len(docs)} documents · {sum(len(d.text) for d in docs):,} characters")
        self.pane.set_documents(docs)
        self.pane.setVisible(bool(docs))

    def sources_chips(self, sources: list[dict], exact_spans: list[dict] | None = None) -> SourceChips:
        """The answer's chips; a click shows the source over that answer's text made exact (`exact_spans`)."""
        chips = SourceChips(sources, self.conv.documents, exact_spans=exact_spans)
        chips.chosen.connect(lambda s, c=chips: self.show_source(s, c.exact_spans))
        chips.open_page.connect(self.pane.open_source_page)
        return chips

    @Slot(dict)
    def show_source(self, source: dict, exact_spans: list[dict] | None = None) -> bool:
        """Show the source's passage; `exact_spans` (its answer's) replace the shading, None keeps it."""
        self.pane.setVisible(True)
        return self.pane.show_source(source, exact_spans)

    def show_exact_spans(self, exact_spans: list[dict] | None) -> None:
        """Shade the latest answer's text made exact in the pane (None or []: no shading)."""
        self.pane.set_exact_spans(exact_spans)

    def dragEnterEvent(self, e) -> None:
        if any(self._droppable(u.toLocalFile()) for u in e.mimeData().urls()):
            e.acceptProposedAction()

    def dropEvent(self, e) -> None:
        paths = [u.toLocalFile() for u in e.mimeData().urls() if self._droppable(u.toLocalFile())]
        if paths:
            self.attach_documents(paths)
            e.acceptProposedAction()

    @staticmethod
    def _droppable(path: str) -> bool:
        p = Path(path)
        return bool(path) and (p.is_dir() or p.suffix.lower() in DOC_SUFFIXES)
