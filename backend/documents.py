"""Reading user documents (text, PDF, Word, web pages, e-books, OpenDocument) and framing them with a question.

The readers of each format are in document_formats.py; here a path becomes a DocumentText (the text the app
reads, and where each PDF page starts in it) and a document and a question become the model's prompt.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import document_formats as formats
from .errors import DocumentError, EmptyDocumentError
from .protocol import ChatMessage

MAX_NOT_TEXT_SHARE = formats.MAX_NOT_TEXT_SHARE

TEXT_SUFFIXES = (".txt", ".md", ".markdown", ".text", ".rst")  # any other suffix is read as text too
_READERS: dict[str, Callable[[Path], str]] = {
    ".docx": formats.read_docx,
    ".html": formats.read_html, ".htm": formats.read_html, ".xhtml": formats.read_html,
    ".epub": formats.read_epub,
    ".odt": formats.read_odt,
}
# What the GUI's file dialog and drop target, and `chat --doc`, offer.
DOCUMENT_SUFFIXES = TEXT_SUFFIXES + (".pdf",) + tuple(_READERS)


@dataclass(frozen=True)
class DocumentText:
    """A document as the app reads it: its file name, its text, and the offset in the text where each page
    starts (a PDF's pages, in order; empty for formats without pages)."""
    name: str
    text: str
    page_starts: tuple[int, ...] = ()

    def page_at(self, offset: int) -> int | None:
        """The page (counting from 1) that holds the character at `offset`; None without pages."""
        if not self.page_starts:
            return None
        return max(1, bisect.bisect_right(self.page_starts, offset))


def read_document_parts(path: str | Path) -> DocumentText:
    p = Path(path)
    if not p.is_file():
        raise DocumentError(f"Document not found: {p}. Check the path.")
    suffix = p.suffix.lower()
    if suffix == ".pdf":
        text, page_starts = formats.read_pdf(p)
    else:
        text, page_starts = _READERS.get(suffix, formats.read_text)(p), ()
    if not text.strip():
        raise EmptyDocumentError(f"{p.name} is empty: there is nothing to ask about. Choose a document with text.")
    return DocumentText(p.name, text, page_starts)


def read_document(path: str | Path) -> str:
    return read_document_parts(path).text


def document_messages(document: str, question: str) -> list[ChatMessage]:
    """One user turn: the document first, the question last (where the model looks hardest)."""
    if not document.strip():
        raise EmptyDocumentError("The document is empty: there is nothing to ask about.")
    content = f"Read this document.\n\n{document.strip()}\n\nQuestion: {question.strip()}"
    return [ChatMessage("user", content)]
