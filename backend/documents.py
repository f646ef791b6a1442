"""Reading user documents (text, PDF, Word, web pages, e-books, OpenDocument) and framing them with a question.

The readers of each format are in document_formats.py; here a path becomes a DocumentText (the text the app
reads, and where each PDF page starts in it) and a document and a question become the model's prompt.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from . import doc_pdf, document_formats as formats
from .doc_budget import ReadBudget
from .errors import Cancelled, DocumentError, EmptyDocumentError
from .protocol import ChatMessage, CompletionRequest

MAX_NOT_TEXT_SHARE = formats.MAX_NOT_TEXT_SHARE

TEXT_SUFFIXES = (".txt", ".md", ".markdown", ".text", ".rst")  # any other suffix is read as text too
_READERS: dict[str, Callable[[Path, ReadBudget], str]] = {
    ".docx": formats.read_docx,
    ".html": formats.read_html, ".htm": formats.read_html, ".xhtml": formats.read_html,
    ".epub": formats.read_epub,
    ".odt": formats.read_odt,
}
# What the GUI's file dialog and drop target, and `chat --doc`, offer.
DOCUMENT_SUFFIXES = TEXT_SUFFIXES + (".pdf",) + tuple(_READERS)
# The documents of one folder, together: read one after the other they may take hours, and their text is far more
# than any model's context (a million tokens is some 4 MB of text; a 300-page illustrated PDF some 100 MB).
MAX_FOLDER_BYTES = 2 * 1024 * 1024 * 1024
# How each of several documents is introduced in the prompt (one document has no heading).
DOCUMENT_HEADING = "Document {i}: {name}"


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


def read_document_parts(path: str | Path, cancelled: Callable[[], bool] | None = None) -> DocumentText:
    """`cancelled()`, when given, is asked between members, pages and every few thousand elements while the file is
    read: True stops the reading with Cancelled (backend/doc_budget.py)."""
    p = Path(path)
    if not p.is_file():
        raise DocumentError(f"Document not found: {p}. Check the path.")
    suffix, budget = p.suffix.lower(), ReadBudget(p.name, cancelled)
    try:
        if suffix == ".pdf":
            text, page_starts = doc_pdf.read_pdf(p, budget)
        else:
            text, page_starts = _READERS.get(suffix, formats.read_text)(p, budget), ()
    except OSError as exc:  # a permission, a disk gone, a file removed meanwhile
        raise DocumentError(f"{p.name} could not be read ({exc.strerror or exc}). Check that the file is there "
                            "and that you may read it, then attach it again.") from exc
    if not text.strip():
        raise EmptyDocumentError(f"{p.name} is empty: there is nothing to ask about. Choose a document with text.")
    return DocumentText(p.name, text, page_starts)


def read_document(path: str | Path, cancelled: Callable[[], bool] | None = None) -> str:
    return read_document_parts(path, cancelled).text


def framed(request: CompletionRequest) -> CompletionRequest:
    """`request` as the model reads it: its unframed documents in its first user turn, as
    app/chat_session.history puts them (framed already: `request` itself)."""
    if not request.unframed_documents or not request.messages:
        return request
    first = document_messages(request.unframed_documents, request.messages[0].content)[0]
    return replace(request, messages=[first, *request.messages[1:]], unframed_documents=None)


def document_messages(documents: str | Sequence[DocumentText], question: str) -> list[ChatMessage]:
    """One user turn: the documents first, in the order attached, the question last (where the model
    looks hardest). One document is framed as it always was (saved prompt caches and measured recall
    stay valid); several each get a heading with their name."""
    if isinstance(documents, str):
        documents = [DocumentText("", documents)]
    if not documents or any(not d.text.strip() for d in documents):
        empty = next((d.name for d in documents if not d.text.strip()), "") if documents else ""
        raise EmptyDocumentError(f"The document {empty + ' ' if empty else ''}is empty: there is nothing to ask about.")
    if len(documents) == 1:
        body = f"Read this document.\n\n{documents[0].text.strip()}"
    else:
        body = "Read these documents.\n\n" + "\n\n".join(
            f"{DOCUMENT_HEADING.format(i=i, name=d.name)}\n\n{d.text.strip()}" for i, d in enumerate(documents, 1))
    return [ChatMessage("user", f"{body}\n\nQuestion: {question.strip()}")]


def read_documents(paths: Sequence[str | Path], cancelled: Callable[[], bool] | None = None) -> list[DocumentText]:
    """Each path's document, in the order given; a folder gives its readable documents (DOCUMENT_SUFFIXES),
    sorted by name; one that cannot be read is skipped; a folder with none, or with more than MAX_FOLDER_BYTES of
    them, is an error. `cancelled()`, when given, is asked between files and while each is read (Cancelled)."""
    out: list[DocumentText] = []
    for path in paths:
        p = Path(path)
        if not p.is_dir():
            out.append(read_document_parts(p, cancelled))
            continue
        found = []
        for f in _folder_documents(p):
            if cancelled is not None and cancelled():
                raise Cancelled(f"stopped reading {p.name}")
            try:
                found.append(read_document_parts(f, cancelled))
            except DocumentError:
                continue  # a folder holds other files too: only its readable documents are attached
        if not found:
            raise DocumentError(f"{p} holds no readable document ({', '.join(DOCUMENT_SUFFIXES)}; symbolic links "
                                "are not followed). Choose a folder with documents in it, or the files themselves.")
        out += found
    return out


def _folder_documents(p: Path) -> list[Path]:
    """The documents a folder holds, by name; refused when they are more than MAX_FOLDER_BYTES together."""
    try:
        # a link is not followed: it may lead out of the folder the user chose, to files they did not mean to share
        files = sorted((f for f in p.iterdir() if not f.is_symlink() and f.is_file()
                        and f.suffix.lower() in DOCUMENT_SUFFIXES and not f.name.startswith(".")), key=lambda f: f.name)
        size = sum(f.stat().st_size for f in files)
    except OSError as exc:
        raise DocumentError(f"The folder {p} could not be read ({exc.strerror or exc}). Check that you may "
                            "open it, or attach the files themselves.") from exc
    if size > MAX_FOLDER_BYTES:
        raise DocumentError(f"The folder {p.name} holds {size >> 20:,} MB of documents, more than the "
                            f"{MAX_FOLDER_BYTES >> 30} GB a folder may hold: far more than any model's context. "
                            "Attach the documents you want to ask about, or a folder with fewer of them.")
    return files
