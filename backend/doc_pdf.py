"""Reading a PDF's text with pypdf, page by page, in bounded time and memory.

pypdf (7.x) bounds one stream: 75 MB decoded, 2 million tokens parsed, 5,000 form XObjects a page. What it does not
bound is the document: a page tree may name one page 10,000 times, and each page may name one large content stream,
so the work grows with the pages (docs/HARDENING.md#bombs-inside-other-formats). Here the page tree is walked first
(MAX_PDF_PAGES), every page's content counts against MAX_PDF_CONTENT_BYTES before it is parsed, the operations run
through text extraction (forms included) against MAX_PDF_OPERATIONS, the text against MAX_UNPACKED_BYTES, and the
budget's clock and cancel flag are asked between pages and every few thousand operations.
"""
from __future__ import annotations

from pathlib import Path

from . import document_formats as formats
from .doc_budget import CHECK_EVERY, ReadBudget
from .errors import DocumentError

PAGE_SEPARATOR = "\n\n"  # between a PDF's pages in the text
# A PDF of more pages is refused before pypdf lists them: at some 500 tokens a page it is far more than any
# model's context, and a page tree that names one branch many times lists millions of pages from a few KB
# (docs/HARDENING.md#a-pdf-that-lists-millions-of-pages)
MAX_PDF_PAGES = 10_000
# The pages' content streams, decoded, in all: a page of text is 5-50 KB of content, so 10,000 such pages fit; a
# page named 10,000 times, each naming one 75 MB stream, would be scanned 10,000 times (750 GB).
MAX_PDF_CONTENT_BYTES = 512 * 1024 * 1024
# Content stream operations run through text extraction, forms included: a page of text runs 1,000-5,000 (10,000
# such pages: 50 million, about 2 minutes of pypdf on a slow core); a page that draws one form 5,000 times, each of
# 2 million operations, would run 10 billion.
MAX_PDF_OPERATIONS = 60_000_000
# A page whose content has none of these byte strings shows no text (pypdf skips such a page too): it is not parsed.
# bytes.find, not a regular expression: ten times faster over a large drawing.
_MAYBE_TEXT = (b"Tj", b"TJ", b"'", b'"', b"Do")
_FORMS = b"Do"  # a page that draws forms: their operations are counted as they run
_ATTACH_PAGES = ("far more than any model's context holds. Attach the pages you want to ask about (print them "
                 "to a new PDF).")


def read_pdf(p: Path, budget: ReadBudget | None = None) -> tuple[str, tuple[int, ...]]:
    """The pages' text joined by a blank line, and where each page starts in it."""
    from pypdf import PasswordType, PdfReader

    budget = budget or ReadBudget(p.name)
    with formats.refused_if_broken(p.name, "a PDF"):
        reader = PdfReader(p)
        if reader.is_encrypted and reader.decrypt("") == PasswordType.NOT_DECRYPTED:  # viewers try "" first
            raise DocumentError(
                f"{p.name} is protected with a password. Open it in a PDF viewer with its password, save or "
                "print a copy without one, and attach that copy."
            )
        _refuse_too_many_pages(reader, p.name)
        pages = _pages_text(reader, p.name, budget)
    if pages and not any(page.strip() for page in pages):
        raise DocumentError(
            f"{p.name} has no text layer (a scan or pictures of pages): run OCR on it, e.g. ocrmypdf, "
            "or export it as text."
        )
    starts, offset = [], 0
    for page in pages:
        starts.append(offset)
        offset += len(page) + len(PAGE_SEPARATOR)
    return PAGE_SEPARATOR.join(pages), tuple(starts)


def _pages_text(reader, name: str, budget: ReadBudget) -> list[str]:
    pages, chars, content_bytes = [], 0, 0
    operations = _OperationCount(name, budget)
    for page in reader.pages:
        budget.check()
        contents = page.get_contents()
        data = contents.get_data() if contents is not None else b""
        content_bytes += len(data)
        if content_bytes > MAX_PDF_CONTENT_BYTES:
            raise DocumentError(f"{name}'s pages draw more than {MAX_PDF_CONTENT_BYTES >> 20} MB of content: far "
                                "more than any document of text needs; it is refused as damaged or hostile. "
                                "Print the pages you want to ask about to a new PDF, or export it as text.")
        if not any(operator in data for operator in _MAYBE_TEXT):
            pages.append("")
            continue
        # the visitor makes pypdf parse every stream it reaches, text or not: only where forms may multiply the work
        visitor = operations if _FORMS in data else None
        pages.append(page.extract_text(visitor_operand_before=visitor) or "")
        operations.raise_if_stopped()  # what a form swallowed
        chars += len(pages[-1])
        if chars > formats.MAX_UNPACKED_BYTES:  # the same page named again and again, each with megabytes of text
            raise DocumentError(f"{name} holds more than {formats.MAX_UNPACKED_BYTES >> 20} million characters of "
                                f"text: {_ATTACH_PAGES}")
    return pages


class _OperationCount:
    """pypdf's visitor of each operation: counts them against MAX_PDF_OPERATIONS and asks the budget every
    CHECK_EVERY. pypdf logs and skips an exception raised inside a form, so once stopped it raises on every call:
    the next operation outside the form carries it out."""

    def __init__(self, name: str, budget: ReadBudget):
        self.name, self.budget = name, budget
        self.left, self.until_check = MAX_PDF_OPERATIONS, CHECK_EVERY
        self.stopped: Exception | None = None

    def __call__(self, operator, operands, cm, tm) -> None:
        if self.stopped is not None:
            raise self.stopped
        self.until_check -= 1
        if self.until_check > 0:
            return
        self.until_check, self.left = CHECK_EVERY, self.left - CHECK_EVERY
        try:
            if self.left < 0:
                raise DocumentError(f"{self.name}'s pages run more than {MAX_PDF_OPERATIONS:,} drawing operations: "
                                    "far more than any document of text needs; it is refused as damaged or hostile. "
                                    "Print the pages you want to ask about to a new PDF, or export it as text.")
            self.budget.check()
        except Exception as exc:
            self.stopped = exc
            raise

    def raise_if_stopped(self) -> None:
        if self.stopped is not None:
            raise self.stopped


def _refuse_too_many_pages(reader, name: str) -> None:
    """Walk the page tree counting every node it reaches (a branch named twice counts twice, as pypdf would list
    it) and stop past twice MAX_PDF_PAGES, so that pypdf never lists more; then refuse more pages than that."""
    stack, reached, budget = [reader.root_object["/Pages"]], 0, 2 * MAX_PDF_PAGES
    while stack and reached <= budget:
        node = stack.pop().get_object()
        reached += 1
        kids = node.get("/Kids") if hasattr(node, "get") else None
        if isinstance(kids, list):
            stack.extend(kids[:budget + 1 - reached])  # enough to pass the budget when there are more
    if reached > budget or len(reader.pages) > MAX_PDF_PAGES:
        raise DocumentError(f"{name} lists more than {MAX_PDF_PAGES:,} pages: {_ATTACH_PAGES}")
