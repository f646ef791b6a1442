"""The conversation view: one widget per message, the last one growing as tokens stream in; an answer's
sources as chips under it; the app's notes (a document added or removed) as a grey line."""
from __future__ import annotations

import math

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QTextCursor
from PySide6.QtWidgets import QFrame, QLabel, QScrollArea, QSizePolicy, QTextEdit, QVBoxLayout, QWidget

ROLE_STYLE = {
    "user": "QFrame#msg { background: palette(alternate-base); border-radius: 8px; }",
    "assistant": "QFrame#msg { border: 1px solid palette(mid); border-radius: 8px; }",
    "note": "QFrame#msg { border: none; } QLabel { color: palette(placeholder-text); font-style: italic; }",
}
WHO = {"user": "You", "assistant": "Assistant"}


class MessageText(QTextEdit):
    """A message's text, word-wrapped and selectable like a label, that grows at its end: a streamed token is
    inserted there (the document lays out only its last paragraph again), where a QLabel would take and lay
    out its whole text again for each token. It is as tall as its text: no scroll bar of its own."""

    def __init__(self, text: str = "", parent=None):
        super().__init__(parent)
        self.setReadOnly(True)
        self.setTextInteractionFlags(Qt.TextSelectableByMouse | Qt.TextSelectableByKeyboard)
        self.setLineWrapMode(QTextEdit.WidgetWidth)
        self.setFrameShape(QFrame.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)
        self.viewport().setAutoFillBackground(False)  # the message frame's colour shows through, as a label's
        self.document().setDocumentMargin(0)
        self.document().documentLayout().documentSizeChanged.connect(self._fit)
        self.setPlainText(text)
        self._fit()

    def text(self) -> str:
        return self.toPlainText()

    def setText(self, text: str) -> None:
        self.setPlainText(text)

    def append_text(self, piece: str) -> None:
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.End)
        cursor.insertText(piece)

    def heightForWidth(self, width: int) -> int:
        """The height the text needs at `width` (at its own width: the height it has)."""
        if width == self.width():
            return self._text_height()
        doc = self.document().clone()
        doc.setTextWidth(width - 2 * self.frameWidth())
        return math.ceil(doc.size().height()) + 2 * self.frameWidth()

    def _text_height(self) -> int:
        return math.ceil(self.document().size().height()) + 2 * self.frameWidth()

    def _fit(self, *_) -> None:
        # a line more or less: the frame grows with it (the view scrolls, not this text)
        if self.height() != self._text_height():
            self.setFixedHeight(self._text_height())

    def wheelEvent(self, e) -> None:
        e.ignore()  # the chat view scrolls, not a message


class MessageWidget(QFrame):
    def __init__(self, role: str, text: str = "", parent=None):
        super().__init__(parent)
        self.setObjectName("msg")
        self.setStyleSheet(ROLE_STYLE.get(role, ""))
        self.role = role
        self.who = QLabel(WHO.get(role, ""))
        self.who.setStyleSheet("font-weight: bold")
        self.who.setVisible(role in WHO)
        self.chips: QWidget | None = None  # the answer's sources (ui/source_chips.py)
        self.body = MessageText(text)
        self.meta = QLabel()
        self.meta.setWordWrap(True)
        self.meta.setStyleSheet("color: palette(placeholder-text); font-size: 11px")
        self.meta.setVisible(False)
        self.exact = QLabel()
        self.exact.setWordWrap(True)
        self.exact.setTextFormat(Qt.PlainText)
        self.exact.setStyleSheet("color: #2874a6; font-size: 11px")
        self.exact.setVisible(False)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 6, 10, 6)
        lay.addWidget(self.who)
        lay.addWidget(self.body)
        self._chips_at = lay.count()  # the sources go under the answer's text
        lay.addWidget(self.exact)
        lay.addWidget(self.meta)

    def text(self) -> str:
        return self.body.text()

    def append(self, piece: str) -> None:
        self.body.append_text(piece)  # not setText(all + piece): that lays out the whole answer per token

    def set_text(self, text: str) -> None:
        self.body.setText(text)

    def set_meta(self, text: str) -> None:
        self.meta.setText(text)
        self.meta.setVisible(bool(text))
        self._relayout()

    def set_exact(self, text: str) -> None:
        self.exact.setText(text)
        self.exact.setVisible(bool(text))
        self._relayout()

    def set_chips(self, chips: QWidget | None) -> None:
        """Show `chips` under the answer (None: none), in place of any shown before."""
        if self.chips is not None:
            self.chips.setParent(None)
            self.chips.deleteLater()
        self.chips = chips
        if chips is not None:
            self.layout().insertWidget(self._chips_at, chips)
        self._relayout()

    def _relayout(self) -> None:
        # a word-wrapped label that gains a line must make its frame taller (Qt does not redo it alone)
        for label in (self.body, self.meta, self.exact):
            label.updateGeometry()
        self.layout().invalidate()
        self.adjustSize()


FOLLOW_SLACK_PX = 4  # a view scrolled this close to its end counts as at the end


class ChatView(QScrollArea):
    """The messages, newest last; while the view is at its end it stays there as an answer grows, and
    once the user scrolls up it stays where they read until they scroll back down."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setWidgetResizable(True)
        self._inner = QWidget()
        self._lay = QVBoxLayout(self._inner)
        self._lay.addStretch(1)
        self.setWidget(self._inner)
        self.messages: list[MessageWidget] = []
        self._follow = True  # at the end: keep to it when the content grows
        bar = self.verticalScrollBar()
        bar.valueChanged.connect(self._on_scrolled)
        bar.rangeChanged.connect(self._on_range)

    def _on_scrolled(self, value: int) -> None:
        self._follow = value >= self.verticalScrollBar().maximum() - FOLLOW_SLACK_PX

    def _on_range(self, _minimum: int, maximum: int) -> None:
        if self._follow:
            self.verticalScrollBar().setValue(maximum)

    def add(self, role: str, text: str = "") -> MessageWidget:
        w = MessageWidget(role, text)
        self._lay.insertWidget(self._lay.count() - 1, w)
        self.messages.append(w)
        self.scroll_to_end()
        return w

    def widget_at(self, index: int) -> MessageWidget | None:
        """The widget of the conversation's message `index` (the view adds one per message, in order)."""
        return self.messages[index] if 0 <= index < len(self.messages) else None

    def clear(self) -> None:
        for w in self.messages:
            w.setParent(None)
            w.deleteLater()
        self.messages = []

    def scroll_to_end(self) -> None:
        self._follow = True  # a new message: follow it, wherever the user had scrolled
        bar = self.verticalScrollBar()
        QTimer.singleShot(0, bar, lambda: bar.setValue(bar.maximum()))  # dropped with the view (a chat closed)
