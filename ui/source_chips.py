"""An answer's sources as chips under it: "p. 14" for a PDF page, "notes.txt ¶ 12" (the paragraph) else.

A click asks to show the passage in the document pane, with the text RidgeFill made exact for the answer
shaded; a PDF chip's menu also opens the file at its page.
"""
from __future__ import annotations

import re
from typing import Sequence

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QLabel, QMenu, QPushButton, QSizePolicy, QWidget

from app.conversations import Document
from ui.flow_layout import FlowLayout

_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n\s*")  # a blank line (or several) ends a paragraph
CHIP_STYLE = ("QPushButton { border: 1px solid #2874a6; border-radius: 9px; padding: 1px 8px; color: #2874a6;"
              " font-size: 11px; } QPushButton:hover { background: #d6eaf8; }")
TOOLTIP_CHARS = 300  # a passage longer than this is cut in the tooltip (the pane shows all of it)


def paragraph_number(text: str, offset: int) -> int:
    """The paragraph (counting from 1) that holds the character at `offset`."""
    return 1 + sum(1 for _ in _PARAGRAPH_BREAK.finditer(text, 0, max(0, offset)))


def chip_label(source: dict, doc: Document | None, several: bool) -> str:
    """"p. 14" for a PDF page, else "NAME ¶ N"; with several documents a page chip names its document too."""
    name = source.get("document", "?")
    if source.get("page") is not None:
        return f"{name} p. {source['page']}" if several else f"p. {source['page']}"
    if doc is None:  # the document was removed since: its paragraphs are not known
        return name
    return f"{name} ¶ {paragraph_number(doc.text, int(source.get('start', 0)))}"


def chip_tooltip(source: dict) -> str:
    text = " ".join(str(source.get("text", "")).split())
    if len(text) > TOOLTIP_CHARS:
        text = text[: TOOLTIP_CHARS - 1] + "…"
    page = f", page {source['page']}" if source.get("page") is not None else ""
    return f"{source.get('document', '?')}{page} (score {float(source.get('score', 0)):.2f})\n\n{text}"


def find_document(documents: Sequence[Document], name: str) -> Document | None:
    """The attached document a source names (the first of that name)."""
    return next((d for d in documents if d.name == name), None)


class SourceChips(QWidget):
    """One chip per source, best first, after the word "Sources"; they wrap to more rows when narrow."""

    chosen = Signal(dict)  # the source to show in the document pane
    open_page = Signal(dict)  # a PDF source: open its file at its page

    def __init__(self, sources: list[dict], documents: Sequence[Document], parent=None,
                 exact_spans: Sequence[dict] | None = None):
        super().__init__(parent)
        self.sources = list(sources)
        self.exact_spans = [dict(s) for s in exact_spans or ()]  # this answer's text made exact, for the pane
        self.chips: list[QPushButton] = []
        lay = FlowLayout(self)
        lay.setContentsMargins(0, 2, 0, 0)
        policy = QSizePolicy(QSizePolicy.Preferred, QSizePolicy.Preferred)
        policy.setHeightForWidth(True)
        self.setSizePolicy(policy)
        head = QLabel("Sources:")
        head.setStyleSheet("color: palette(placeholder-text); font-size: 11px")
        if self.exact_spans:
            head.setToolTip("A click shows the passage; the shaded text beside it was made exact by RidgeFill.")
        lay.addWidget(head)
        several = len(documents) > 1
        for s in self.sources:
            chip = QPushButton(chip_label(s, find_document(documents, s.get("document", "")), several))
            chip.setStyleSheet(CHIP_STYLE)
            chip.setCursor(Qt.PointingHandCursor)
            chip.setToolTip(chip_tooltip(s))
            chip.clicked.connect(lambda _=False, s=s: self.chosen.emit(s))
            if s.get("page") is not None:
                chip.setContextMenuPolicy(Qt.CustomContextMenu)
                chip.customContextMenuRequested.connect(lambda pos, c=chip, s=s: self._menu(c, s, pos))
            lay.addWidget(chip)
            self.chips.append(chip)

    def _menu(self, chip: QPushButton, source: dict, pos) -> None:
        menu = QMenu(chip)
        menu.addAction("Show in the document pane", lambda: self.chosen.emit(source))
        menu.addAction(f"Open the PDF at page {source['page']}", lambda: self.open_page.emit(source))
        menu.exec(chip.mapToGlobal(pos))
