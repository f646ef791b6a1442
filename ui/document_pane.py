"""The document pane: the chat's attached documents in a list (remove one there), the chosen one's text
below, read-only; showing a source selects and highlights its passage, and a PDF's can be opened at its page.
The text RidgeFill made exact for the answer (backend/exact_spans.py) is shaded in a lighter colour under it.
A long document is laid out a part at a time (ui/text_window.py), with Earlier and Later to move between parts.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from PySide6.QtCore import QEvent, Qt, QUrl, Signal, Slot
from PySide6.QtGui import QColor, QDesktopServices, QPalette, QTextCharFormat, QTextCursor, QTextFormat
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QListWidget,
    QPlainTextEdit,
    QPushButton,
    QTextEdit,
    QVBoxLayout,
    QWidget,
)

from app.conversations import Document
from ui.text_window import WINDOW_CHARS, holds, window_around, window_before, window_from

HIGHLIGHT = QColor("#fff59d")  # the passage a source points at
HIGHLIGHT_TEXT = QColor("#000000")  # its text: a light palette's white text would vanish on the yellow
EXACT_SHARE = 0.3  # how much of the palette's highlight colour goes into the base for the exact shade
MARK_KIND = QTextFormat.UserProperty + 1  # on each extra selection's format: which kind of mark it is
SOURCE_MARK, EXACT_MARK = "source", "exact"
EXACT_LEGEND = "made exact by RidgeFill"
EXACT_TIP = ("Shaded: the text whose rows RidgeFill made exact for this answer (the places the question "
             "attended to, and the document's end when it reaches the exact tail); the rest was approximated.")
NO_DOCUMENTS = "No document attached. Attach files or a folder; their text shows here."


def qt_position(text: str, offset: int) -> int:
    """Where character `offset` of `text` is in a Qt text document: Qt counts UTF-16 units, and reads
    "\\r\\n" as one line break."""
    before = text[:offset]
    return len(before.encode("utf-16-le")) // 2 - before.count("\r\n")


def exact_shade(palette: QPalette) -> QColor:
    """The shade of text made exact: the palette's highlight mixed into its base, so it shows on a light and
    a dark palette alike and the palette's text stays readable on it."""
    base, accent = palette.color(QPalette.Base), palette.color(QPalette.Highlight)
    mix = [b * (1 - EXACT_SHARE) + a * EXACT_SHARE for b, a in zip(base.getRgbF()[:3], accent.getRgbF()[:3])]
    return QColor.fromRgbF(*mix)


def page_url(path: str, page: int) -> QUrl:
    """The file's URL with "#page=N", which most PDF viewers open at that page."""
    url = QUrl.fromLocalFile(str(Path(path).resolve()))
    url.setFragment(f"page={page}")
    return url


def document_line(d: Document, window: tuple[int, int] | None = None) -> str:
    pages = f" · {len(d.page_starts)} pages" if d.page_starts else ""
    part = f" · showing {window[0]:,}–{window[1]:,}" if window and window[1] - window[0] < len(d.text) else ""
    return f"{d.name} · {len(d.text):,} characters{pages}{part}"


class DocumentPane(QWidget):
    remove_requested = Signal(int)  # the index of the document to remove from the chat

    def __init__(self, parent=None):
        super().__init__(parent)
        self.documents: list[Document] = []
        self.source: dict | None = None  # the source shown last
        self.exact_spans: list[dict] = []  # the answer's text made exact: {"document", "start", "end"}
        self._marked: tuple[str, int, int] | None = None  # the highlighted passage: document, start, end
        self._shown = -1  # the index of the document whose text the view holds
        self._window = (0, 0)  # the part of it the view holds: characters [lo, hi) (text_window.py)
        self._part = ""  # that part's text
        self.list = QListWidget()
        self.list.setMaximumHeight(96)
        self.list.setTextElideMode(Qt.ElideMiddle)  # a long name is cut in its middle, not scrolled
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.remove_btn = QPushButton("Remove")
        self.remove_btn.setToolTip("Take the chosen document out of this chat")
        self.where = QLabel(NO_DOCUMENTS)
        self.where.setWordWrap(True)
        self.open_btn = QPushButton()
        self.open_btn.setVisible(False)
        self.earlier_btn, self.later_btn = QPushButton("◀ Earlier"), QPushButton("Later ▶")
        for btn, what in ((self.earlier_btn, "before"), (self.later_btn, "after")):
            btn.setToolTip(f"A long document shows {WINDOW_CHARS:,} characters at a time: show the part {what}")
            btn.setVisible(False)
        self.legend = QLabel()
        self.legend.setToolTip(EXACT_TIP)
        self.legend.setVisible(False)
        self.view = QPlainTextEdit()
        self.view.setReadOnly(True)
        row = QHBoxLayout()
        row.addWidget(self.where, 1)
        row.addWidget(self.earlier_btn)
        row.addWidget(self.later_btn)
        row.addWidget(self.open_btn)
        row.addWidget(self.remove_btn)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.list)
        lay.addLayout(row)
        lay.addWidget(self.legend)
        lay.addWidget(self.view, 1)
        self.list.currentRowChanged.connect(self.show_document)
        self.remove_btn.clicked.connect(self._remove_current)
        self.open_btn.clicked.connect(self.open_page)
        self.earlier_btn.clicked.connect(self.show_earlier)
        self.later_btn.clicked.connect(self.show_later)
        self.set_documents([])

    def set_documents(self, documents: Sequence[Document]) -> None:
        """Show these documents (the chat's, in the order attached); the one shown before stays if it is there."""
        current = self.documents[self._shown].name if 0 <= self._shown < len(self.documents) else None
        self.documents = list(documents)
        self.list.blockSignals(True)
        self.list.clear()
        self.list.addItems([document_line(d) for d in self.documents])
        for i, d in enumerate(self.documents):
            self.list.item(i).setToolTip(document_line(d) + (f"\n{d.path}" if d.path else ""))
        self.list.blockSignals(False)
        self._shown = -1
        names = [d.name for d in self.documents]
        self.show_document(names.index(current) if current in names else 0)
        self.remove_btn.setEnabled(bool(self.documents))

    @Slot(int)
    def show_document(self, index: int) -> None:
        if not self.documents:
            self._shown = -1
            self._set_window("", (0, 0))
            self.view.setPlaceholderText(NO_DOCUMENTS)
            self.where.setText(NO_DOCUMENTS)
            self._show_open(None)
            self._paint()
            return
        index = max(0, min(index, len(self.documents) - 1))
        if index != self._shown:
            self._shown = index
            text = self.documents[index].text
            self._set_window(text, window_from(text, 0))
            self._show_open(None)
            self._paint()
        if self.list.currentRow() != index:
            self.list.setCurrentRow(index)

    def set_exact_spans(self, spans: Sequence[dict] | None) -> None:
        """Shade these spans (an answer's text made exact) wherever their document is shown; None or [] clears."""
        self.exact_spans = [dict(s) for s in spans or ()]
        self._paint()

    def show_source(self, source: dict, exact_spans: Sequence[dict] | None = None) -> bool:
        """Scroll to the source's passage, select it and highlight it, over `exact_spans` (its answer's text
        made exact; None keeps the shading shown); False (and says so) when the chat no longer holds its
        document."""
        if exact_spans is not None:
            self.exact_spans = [dict(s) for s in exact_spans]
        names = [d.name for d in self.documents]
        if source.get("document") not in names:
            self.where.setText(f"{source.get('document')} is no longer attached to this chat.")
            self._paint()
            return False
        index = names.index(source["document"])
        self.show_document(index)
        text = self.documents[index].text
        start, end = (max(0, min(int(source.get(k, 0)), len(text))) for k in ("start", "end"))
        self._marked = (source["document"], start, max(start, end))
        if not holds(self._window, start, min(max(start, end), start + WINDOW_CHARS // 2)):
            self._set_window(text, window_around(text, start, max(start, end)))
        cursor = self._paint()
        self.view.setTextCursor(cursor)
        self.view.centerCursor()
        page = f", p. {source['page']}" if source.get("page") is not None else ""
        self.where.setText(f"{source['document']}{page}: characters {start:,}–{end:,}")
        self._show_open(source)
        return True

    def _set_window(self, text: str, window: tuple[int, int]) -> None:
        """Lay out characters [lo, hi) of `text` (the shown document's) in the view; Earlier and Later show
        when the document is longer than a part."""
        self._window = window
        self._part = text[window[0]:window[1]]
        self.view.setPlainText(self._part)
        partial = window[1] - window[0] < len(text)
        self.earlier_btn.setVisible(partial)
        self.later_btn.setVisible(partial)
        self.earlier_btn.setEnabled(window[0] > 0)
        self.later_btn.setEnabled(window[1] < len(text))
        if 0 <= self._shown < len(self.documents):
            self.where.setText(document_line(self.documents[self._shown], window))

    @Slot()
    def show_earlier(self) -> None:
        if 0 <= self._shown < len(self.documents) and self._window[0] > 0:
            text = self.documents[self._shown].text
            self._set_window(text, window_before(text, self._window[0]))
            self.view.moveCursor(QTextCursor.End)  # where the part shown before began
            self._paint()

    @Slot()
    def show_later(self) -> None:
        if 0 <= self._shown < len(self.documents) and self._window[1] < len(self.documents[self._shown].text):
            text = self.documents[self._shown].text
            self._set_window(text, window_from(text, self._window[1]))
            self._paint()

    def selected_text(self) -> str:
        """The text selected in the view, with Qt's paragraph separators as line breaks."""
        return self.view.textCursor().selectedText().replace("\u2029", "\n")

    def highlighted_text(self) -> str:
        marks = self.marks(SOURCE_MARK)
        return marks[0].cursor.selectedText().replace("\u2029", "\n") if marks else ""

    def marks(self, kind: str) -> list:
        """The view's extra selections of one kind (SOURCE_MARK, EXACT_MARK), in text order."""
        return [m for m in self.view.extraSelections() if m.format.property(MARK_KIND) == kind]

    def _paint(self) -> QTextCursor | None:
        """Lay the shown document's exact shading and, over it, the highlighted passage; the passage's cursor."""
        if not 0 <= self._shown < len(self.documents):
            self.view.setExtraSelections([])
            self.legend.setVisible(False)
            return None
        doc = self.documents[self._shown]
        shade = exact_shade(self.palette())
        marks = [self._mark(self._cursor(s["start"], s["end"]), EXACT_MARK, shade)
                 for s in self.exact_spans if s.get("document") == doc.name and self._meets(s["start"], s["end"])]
        self.legend.setText(f'<span style="background-color: {shade.name()}">&nbsp;&nbsp;&nbsp;&nbsp;</span> '
                            f'{EXACT_LEGEND} ({len(marks)} {"span" if len(marks) == 1 else "spans"})')
        self.legend.setVisible(bool(marks))
        cursor = None
        if self._marked is not None and self._marked[0] == doc.name and self._meets(*self._marked[1:]):
            cursor = self._cursor(self._marked[1], self._marked[2])
            marks.append(self._mark(cursor, SOURCE_MARK, HIGHLIGHT, HIGHLIGHT_TEXT))  # last: over the shading
        self.view.setExtraSelections(marks)
        return cursor

    def _meets(self, start: int, end: int) -> bool:
        """True when characters [start, end) of the shown document touch the part the view holds."""
        return int(start) <= self._window[1] and int(end) >= self._window[0]

    def _cursor(self, start: int, end: int) -> QTextCursor:
        """A cursor selecting characters [start, end) of the shown document, cut to the part the view holds."""
        lo, part = self._window[0], self._part
        start, end = (max(0, min(int(x) - lo, len(part))) for x in (start, end))
        cursor = QTextCursor(self.view.document())
        cursor.setPosition(qt_position(part, start))
        cursor.setPosition(qt_position(part, max(start, end)), QTextCursor.KeepAnchor)
        return cursor

    @staticmethod
    def _mark(cursor: QTextCursor, kind: str, background: QColor, foreground=None):
        mark = QTextEdit.ExtraSelection()
        mark.cursor = cursor
        fmt = QTextCharFormat()
        fmt.setBackground(background)
        if foreground is not None:
            fmt.setForeground(foreground)
        fmt.setProperty(MARK_KIND, kind)
        mark.format = fmt
        return mark

    def changeEvent(self, event) -> None:
        if event.type() == QEvent.PaletteChange:  # a light/dark switch: the shade follows the new palette
            self._paint()
        super().changeEvent(event)

    def page_to_open(self) -> QUrl | None:
        """The URL "Open at page" opens for the source shown last: a PDF whose file is known; else None."""
        s = self.source
        if not s or s.get("page") is None:
            return None
        doc = next((d for d in self.documents if d.name == s.get("document")), None)
        return page_url(doc.path, int(s["page"])) if doc and doc.path else None

    @Slot()
    def open_page(self) -> bool:
        """Open the source's PDF at its page in the system viewer; False (and says why) if it cannot."""
        url = self.page_to_open()
        if url is None or not Path(url.toLocalFile()).is_file():
            self.where.setText("The PDF file is not where it was attached from: attach it again to open it.")
            return False
        return QDesktopServices.openUrl(url)

    def open_source_page(self, source: dict) -> bool:
        return self.show_source(source) and self.open_page()

    def _show_open(self, source: dict | None) -> None:
        self.source = source
        url = self.page_to_open()
        self.open_btn.setVisible(url is not None)
        if url is not None:
            self.open_btn.setText(f"Open at p. {source['page']}")
            self.open_btn.setToolTip(f"Open {source['document']} at page {source['page']} in the PDF viewer")

    @Slot()
    def _remove_current(self) -> None:
        if 0 <= self.list.currentRow() < len(self.documents):
            self.remove_requested.emit(self.list.currentRow())
