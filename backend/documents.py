"""Reading user documents (.txt, .md, .pdf) and framing them with a question for the model."""
from __future__ import annotations

import codecs
import re
from pathlib import Path

from .errors import DocumentError, EmptyDocumentError
from .protocol import ChatMessage

# A file is refused as "not text" when more than this share of its characters are control characters
# (other than tab, line and page breaks) or bytes no encoding we read could decode. Text, in UTF-8 or a
# legacy Windows/Latin-1 encoding, has next to none; random bytes read as Windows-1252 have about 13%,
# binary files (images, archives, Word's .docx) more; a log with a colour code (ESC) per line stays below.
MAX_NOT_TEXT_SHARE = 0.05
_NOT_TEXT = re.compile("[\x00-\x08\x0e-\x1f\x7f-\x9f\ufffd]")  # controls (category Cc) but \t\n\v\f\r; U+FFFD


def read_document(path: str | Path) -> str:
    p = Path(path)
    if not p.is_file():
        raise DocumentError(f"Document not found: {p}. Check the path.")
    text = _read_pdf(p) if p.suffix.lower() == ".pdf" else _read_text(p)
    if not text.strip():
        raise EmptyDocumentError(f"{p.name} is empty: there is nothing to ask about. Choose a document with text.")
    return text


def _read_text(p: Path) -> str:
    """UTF-8 (a BOM is dropped), UTF-16 with a BOM (Notepad's "Unicode"), else Windows-1252 (a superset
    of Latin-1's letters); then refused if it does not look like text in any of them."""
    raw = p.read_bytes()
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        try:
            text = raw.decode("utf-16")
        except UnicodeDecodeError:
            text = raw.decode("cp1252", errors="replace")
    else:
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError:
            text = raw.decode("cp1252", errors="replace")
    bad = len(_NOT_TEXT.findall(text))
    if text and bad / len(text) > MAX_NOT_TEXT_SHARE:
        raise DocumentError(
            f"{p.name} does not look like text: {bad / len(text):.0%} of it is control characters or bytes "
            "that decode as no character (a binary file, or text in an unusual encoding). Open it in the "
            "program that made it and save or export it as plain text (UTF-8) or PDF."
        )
    return text.replace("\r\n", "\n").replace("\r", "\n")  # as a text-mode read gives it


def _read_pdf(p: Path) -> str:
    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    try:
        reader = PdfReader(p)
        return "\n\n".join((page.extract_text() or "") for page in reader.pages)
    except (PyPdfError, OSError, ValueError) as exc:
        raise DocumentError(f"{p.name} could not be read as a PDF ({exc}). Try exporting it as text.") from exc


def document_messages(document: str, question: str) -> list[ChatMessage]:
    """One user turn: the document first, the question last (where the model looks hardest)."""
    if not document.strip():
        raise EmptyDocumentError("The document is empty: there is nothing to ask about.")
    content = f"Read this document.\n\n{document.strip()}\n\nQuestion: {question.strip()}"
    return [ChatMessage("user", content)]
