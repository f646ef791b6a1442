"""Reading user documents (.txt, .md, .pdf) and framing them with a question for the model."""
from __future__ import annotations

from pathlib import Path

from .errors import DocumentError, EmptyDocumentError
from .protocol import ChatMessage


def read_document(path: str | Path) -> str:
    p = Path(path)
    if not p.is_file():
        raise DocumentError(f"Document not found: {p}. Check the path.")
    if p.suffix.lower() == ".pdf":
        text = _read_pdf(p)
    else:
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            text = p.read_bytes().decode("latin-1")
    if not text.strip():
        raise EmptyDocumentError(f"{p.name} is empty: there is nothing to ask about. Choose a document with text.")
    return text


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
