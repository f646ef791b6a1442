"""One reader per document format: plain text, PDF (with its page starts), Word, HTML, EPUB and OpenDocument.

Each reader takes a path and returns the text (a PDF also the character offset where each page starts), or
raises DocumentError with one line that says what happened and what the user can do. One small library per
format (python-docx, inscriptis, odfpy; pypdf for PDF) instead of markitdown: together they add 17 MB and
5 packages to the install where markitdown[docx,epub] adds about 100 MB and 13 (onnxruntime and magika for
its file-type guessing), and markitdown reads no .odt. EPUB is read with zipfile and lxml, because the
EPUB library (ebooklib) is AGPL-licensed and would bind the bundled app to it.
"""
from __future__ import annotations

import codecs
import errno
import posixpath
import re
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator
from urllib.parse import unquote

from .errors import DocumentError

# A file is refused as "not text" when more than this share of its characters are control characters
# (other than tab, line and page breaks) or bytes no encoding we read could decode. Text, in UTF-8 or a
# legacy Windows/Latin-1 encoding, has next to none; random bytes read as Windows-1252 have about 13%,
# binary files (images, archives, Word's .docx) more; a log with a colour code (ESC) per line stays below.
MAX_NOT_TEXT_SHARE = 0.05
_NOT_TEXT = re.compile("[\x00-\x08\x0e-\x1f\x7f-\x9f\ufffd]")  # controls (category Cc) but \t\n\v\f\r; U+FFFD
# A .docx, .epub or .odt whose members would unpack to more than this is refused (a zip bomb, not a book),
# and so is a text or web page file larger than this (over 100 million tokens).
MAX_UNPACKED_BYTES = 512 * 1024 * 1024
# The XML inside a .docx, .epub or .odt becomes a tree of objects in its reader (python-docx and lxml, odfpy):
# odfpy takes about 600 bytes an element (3 million: 1.8 GB). A file whose XML holds more elements and attributes
# in all, or one XML part larger than this, is refused by a counting pass that builds nothing, so reading any
# document stays under 2 GB (docs/HARDENING.md#xml-bombs-within-the-caps).
MAX_XML_ELEMENTS = 2_000_000
MAX_XML_MEMBER_BYTES = 64 * 1024 * 1024
_XML_MEMBER = re.compile(r"\.(xml|rels|opf|ncx|x?html?)$", re.IGNORECASE)
PAGE_SEPARATOR = "\n\n"  # between a PDF's pages in the text
# A PDF of more pages is refused before pypdf lists them: at some 500 tokens a page it is far more than any
# model's context, and a page tree that names one branch many times lists millions of pages from a few KB
# (docs/HARDENING.md#a-pdf-that-lists-millions-of-pages)
MAX_PDF_PAGES = 10_000

# Reading failed for the system's reason (a permission, a disk, a file gone), not the file's bytes
_SYSTEM_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EIO, errno.ENOENT, errno.EMFILE, errno.ENFILE,
                            errno.ENOMEM, errno.EISDIR})
_SAVE_AGAIN = "Open it in the program that made it and save it again, or export it as PDF or plain text."
_ATTACH_PAGES = ("far more than any model's context holds. Attach the pages you want to ask about (print them "
                 "to a new PDF).")


def read_text(p: Path) -> str:
    return decode_text(_read_bounded(p), p.name)


def _read_bounded(p: Path) -> bytes:
    """A text or web page file's bytes, refused past MAX_UNPACKED_BYTES: no model's context holds that much."""
    if (size := p.stat().st_size) > MAX_UNPACKED_BYTES:
        raise DocumentError(f"{p.name} is {size >> 20:,} MB of text: far more than any model's context holds. "
                            "Attach the part you want to ask about.")
    return p.read_bytes()


def decode_text(raw: bytes, name: str) -> str:
    """UTF-8 (a BOM is dropped), UTF-16 with a BOM (Notepad's "Unicode"), else Windows-1252 (a superset
    of Latin-1's letters); then refused if it does not look like text in any of them."""
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
            f"{name} does not look like text: {bad / len(text):.0%} of it is control characters or bytes "
            "that decode as no character (a binary file, or text in an unusual encoding). Open it in the "
            "program that made it and save or export it as plain text (UTF-8) or PDF."
        )
    return text.replace("\r\n", "\n").replace("\r", "\n")  # as a text-mode read gives it


@contextmanager
def _refused_if_broken(name: str, kind: str) -> Iterator[None]:
    """A damaged file can make a format library fail with any exception: each becomes one DocumentError."""
    try:
        yield
    except DocumentError:
        raise
    except Exception as exc:  # noqa: BLE001 - the parsers' own errors on bad input are many and undocumented
        if isinstance(exc, OSError) and exc.errno in _SYSTEM_ERRNOS:
            raise  # not the file's bytes: documents.read_document_parts says so, not "damaged"
        reason = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:160]
        raise DocumentError(f"{name} could not be read as {kind} ({reason}). {_SAVE_AGAIN}") from exc


def read_pdf(p: Path) -> tuple[str, tuple[int, ...]]:
    """The pages' text joined by a blank line, and where each page starts in it."""
    from pypdf import PasswordType, PdfReader

    with _refused_if_broken(p.name, "a PDF"):
        reader = PdfReader(p)
        if reader.is_encrypted and reader.decrypt("") == PasswordType.NOT_DECRYPTED:  # viewers try "" first
            raise DocumentError(
                f"{p.name} is protected with a password. Open it in a PDF viewer with its password, save or "
                "print a copy without one, and attach that copy."
            )
        _refuse_too_many_pages(reader, p.name)
        pages, chars = [], 0
        for page in reader.pages:
            pages.append(page.extract_text() or "")
            chars += len(pages[-1])
            if chars > MAX_UNPACKED_BYTES:  # the same page named again and again, each with megabytes of text
                raise DocumentError(f"{p.name} holds more than {MAX_UNPACKED_BYTES >> 20} million characters of "
                                    f"text: {_ATTACH_PAGES}")
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


@contextmanager
def _open_zip(p: Path, kind: str) -> Iterator[zipfile.ZipFile]:
    """.docx, .epub and .odt are zip archives: a damaged one, or one that unpacks to too much, is refused."""
    try:
        archive = zipfile.ZipFile(p)
    # NotImplementedError: a zip feature or version the standard library does not read ("zip file version 16.0")
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, OSError, ValueError, EOFError) as exc:
        raise DocumentError(
            f"{p.name} is damaged or is not really {kind} (it is not a readable zip archive: {exc}). "
            + _SAVE_AGAIN
        ) from exc
    with archive:
        if sum(info.file_size for info in archive.infolist()) > MAX_UNPACKED_BYTES:
            raise DocumentError(f"{p.name} would unpack to more than {MAX_UNPACKED_BYTES >> 20} MB: it is "
                                f"refused as damaged or hostile. {_SAVE_AGAIN}")
        with _refused_if_broken(p.name, kind):  # the count reads every XML part: a damaged one fails here first
            _refuse_xml_bombs(archive, p.name)
        yield archive


class _TooManyElements(Exception):
    pass


class _ElementCounter:
    """An lxml parser target: counts elements and attributes, builds nothing (memory stays flat)."""

    def __init__(self, budget: int):
        self.left = budget

    def start(self, tag, attrib) -> None:
        self.left -= 1 + len(attrib)
        if self.left < 0:
            raise _TooManyElements

    def close(self) -> None:
        return None


def _refuse_xml_bombs(archive: zipfile.ZipFile, name: str) -> None:
    """DocumentError when the archive's XML members together hold more than MAX_XML_ELEMENTS elements, or one is
    larger than MAX_XML_MEMBER_BYTES: streamed through a counting parser before any reader builds a tree."""
    counter = _ElementCounter(MAX_XML_ELEMENTS)
    refused = (f"{name} holds more XML than any document of its size needs (over {MAX_XML_ELEMENTS:,} elements, or "
               f"one part over {MAX_XML_MEMBER_BYTES >> 20} MB): it is refused as damaged or hostile. {_SAVE_AGAIN}")
    for info in archive.infolist():
        if not _XML_MEMBER.search(info.filename):
            continue
        if info.file_size > MAX_XML_MEMBER_BYTES:
            raise DocumentError(refused)
        try:
            _count_elements(archive, info, counter)
        except _TooManyElements:
            raise DocumentError(refused) from None


def _count_elements(archive: zipfile.ZipFile, info: zipfile.ZipInfo, counter: _ElementCounter) -> None:
    from lxml import etree

    parser = etree.XMLParser(target=counter, recover=True, huge_tree=False, **_XML_PARSER_OPTIONS)
    try:
        with archive.open(info) as member:
            while chunk := member.read(1 << 20):
                parser.feed(chunk)
        parser.close()
    except etree.LxmlError:  # not XML to lxml (an HTML chapter, an empty part): each "<" counts, an upper bound
        with archive.open(info) as member:
            while chunk := member.read(1 << 20):
                counter.left -= chunk.count(b"<")
        if counter.left < 0:
            raise _TooManyElements from None


def read_docx(p: Path) -> str:
    """The body's paragraphs and tables in document order; a table row is its cells joined by tabs."""
    import docx
    from docx.table import Table

    with _open_zip(p, "a Word document"), _refused_if_broken(p.name, "a Word document"):
        lines = []
        for block in docx.Document(str(p)).iter_inner_content():
            if isinstance(block, Table):
                lines.extend("\t".join(_row_cells(row, block)) for row in block.rows)
            else:
                lines.append(block.text)
        return "\n".join(lines)


def _row_cells(row, table) -> Iterator[str]:
    """Each cell of a table row once. python-docx's `row.cells` repeats a merged cell once per grid column
    it spans, as many times as the file's gridSpan says: a small hostile file can ask for 2,000,000,000."""
    from docx.table import _Cell

    for tc in row._tr.tc_lst:
        # the lower rows of a vertically merged cell hold nothing of their own: its text is in the top row
        yield "" if tc.vMerge == "continue" else _Cell(tc, table).text


def html_text(raw: bytes, name: str) -> str:
    """A web page's visible text laid out as a browser's text view would (blocks, lists, tables)."""
    from inscriptis import get_text

    text = decode_text(raw, name)  # a binary file named .html is refused here, with the reason
    with _refused_if_broken(name, "a web page"):
        return get_text(text)


def read_html(p: Path) -> str:
    return html_text(_read_bounded(p), p.name)


_XML_PARSER_OPTIONS = {"resolve_entities": False, "no_network": True}  # a document may not fetch or expand
_CONTAINER_NS = "{urn:oasis:names:tc:opendocument:xmlns:container}"
_OPF_NS = {"opf": "http://www.idpf.org/2007/opf"}


def read_epub(p: Path) -> str:
    """The chapters in reading order (the package's spine), each as a web page's text."""
    from lxml import etree

    parser = etree.XMLParser(**_XML_PARSER_OPTIONS)
    with _open_zip(p, "an EPUB e-book") as archive, _refused_if_broken(p.name, "an EPUB e-book"):
        container = etree.fromstring(archive.read("META-INF/container.xml"), parser)
        package_path = container.find(f".//{_CONTAINER_NS}rootfile").get("full-path")
        package = etree.fromstring(archive.read(package_path), parser)
        manifest = {item.get("id"): item for item in package.iterfind(".//opf:manifest/opf:item", _OPF_NS)}
        chapters, members = [], set()
        for ref in package.iterfind(".//opf:spine/opf:itemref", _OPF_NS):
            item = manifest.get(ref.get("idref"))
            if item is None or "html" not in (item.get("media-type") or ""):
                continue  # the spine may name images or other media: they hold no text
            member = posixpath.normpath(posixpath.join(posixpath.dirname(package_path), unquote(item.get("href"))))
            if member in members:
                continue  # read once: a spine naming one chapter 100,000 times would unpack it as often
            members.add(member)
            chapters.append(html_text(archive.read(member), f"{p.name}: {member}").strip())
        return "\n\n".join(chapter for chapter in chapters if chapter)


def read_odt(p: Path) -> str:
    """The paragraphs and headings of an OpenDocument text (LibreOffice Writer), in document order."""
    from odf import teletype
    from odf.namespaces import TEXTNS
    from odf.opendocument import load

    blocks = {(TEXTNS, "p"), (TEXTNS, "h")}
    with _open_zip(p, "an OpenDocument text"), _refused_if_broken(p.name, "an OpenDocument text"):
        lines: list[str] = []

        def walk(node) -> None:
            for child in node.childNodes:
                if getattr(child, "qname", None) in blocks:
                    lines.append(teletype.extractText(child))  # its spaces, tabs and line breaks included
                elif child.nodeType == child.ELEMENT_NODE:
                    walk(child)

        walk(load(str(p)).text)
        return "\n".join(lines)
