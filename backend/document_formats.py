"""One reader per document format: plain text, Word, HTML, EPUB and OpenDocument (PDF: doc_pdf.py).

Each reader takes a path and a ReadBudget (doc_budget.py: the elements, time and cancel flag of one document's
reading) and returns the text, or raises DocumentError with one line that says what happened and what the user can
do, or Cancelled when the user stopped it. One small library per
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

from .doc_budget import MAX_XML_MEMBER_BYTES, ReadBudget, looks_like_xml
from .errors import Cancelled, DocumentError

# A file is refused as "not text" when more than this share of its characters are control characters
# (other than tab, line and page breaks) or bytes no encoding we read could decode. Text, in UTF-8 or a
# legacy Windows/Latin-1 encoding, has next to none; random bytes read as Windows-1252 have about 13%,
# binary files (images, archives, Word's .docx) more; a log with a colour code (ESC) per line stays below.
MAX_NOT_TEXT_SHARE = 0.05
_NOT_TEXT = re.compile("[\x00-\x08\x0e-\x1f\x7f-\x9f\ufffd]")  # controls (category Cc) but \t\n\v\f\r; U+FFFD
# A .docx, .epub or .odt whose members would unpack to more than this is refused (a zip bomb, not a book),
# and so is a text or web page file larger than this (over 100 million tokens).
MAX_UNPACKED_BYTES = 512 * 1024 * 1024
# Reading failed for the system's reason (a permission, a disk, a file gone), not the file's bytes
_SYSTEM_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EIO, errno.ENOENT, errno.EMFILE, errno.ENFILE,
                            errno.ENOMEM, errno.EISDIR})
_SAVE_AGAIN = "Open it in the program that made it and save it again, or export it as PDF or plain text."


def read_text(p: Path, budget: ReadBudget | None = None) -> str:
    return decode_text(_read_bounded(p), p.name, budget)


def _read_bounded(p: Path) -> bytes:
    """A text or web page file's bytes, refused past MAX_UNPACKED_BYTES: no model's context holds that much."""
    if (size := p.stat().st_size) > MAX_UNPACKED_BYTES:
        raise DocumentError(f"{p.name} is {size >> 20:,} MB of text: far more than any model's context holds. "
                            "Attach the part you want to ask about.")
    return p.read_bytes()


def decode_text(raw: bytes, name: str, budget: ReadBudget | None = None) -> str:
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
    if text and (bad := _not_text_count(text, budget or ReadBudget(name))) / len(text) > MAX_NOT_TEXT_SHARE:
        raise DocumentError(
            f"{name} does not look like text: {bad / len(text):.0%} of it or more is control characters or bytes "
            "that decode as no character (a binary file, or text in an unusual encoding). Open it in the "
            "program that made it and save or export it as plain text (UTF-8) or PDF."
        )
    return text.replace("\r\n", "\n").replace("\r", "\n")  # as a text-mode read gives it


def _not_text_count(text: str, budget: ReadBudget) -> int:
    """The characters that are not text, counted a megabyte at a time (findall on the whole would list one
    string per character: 4 GB for 512 MB of zero bytes), stopping once they are too many to be text."""
    bad, chunk = 0, 1 << 20
    for start in range(0, len(text), chunk):
        budget.check()
        bad += len(_NOT_TEXT.findall(text, start, start + chunk))
        if bad > MAX_NOT_TEXT_SHARE * len(text):
            break
    return bad


@contextmanager
def refused_if_broken(name: str, kind: str) -> Iterator[None]:
    """A damaged file can make a format library fail with any exception: each becomes one DocumentError."""
    try:
        yield
    except (DocumentError, Cancelled):
        raise
    except Exception as exc:  # noqa: BLE001 - the parsers' own errors on bad input are many and undocumented
        if isinstance(exc, OSError) and exc.errno in _SYSTEM_ERRNOS:
            raise  # not the file's bytes: documents.read_document_parts says so, not "damaged"
        reason = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:160]
        raise DocumentError(f"{name} could not be read as {kind} ({reason}). {_SAVE_AGAIN}") from exc


@contextmanager
def _open_zip(p: Path, kind: str, budget: ReadBudget | None) -> Iterator[zipfile.ZipFile]:
    """.docx, .epub and .odt are zip archives: a damaged one, or one that unpacks to too much, is refused. With a
    budget, every member that looks like XML, whatever its name, is counted against it before the format's library
    parses the parts it wants (.docx and .odt); without, the reader counts what it parses itself (.epub)."""
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
        if budget is not None:
            with refused_if_broken(p.name, kind):  # the count reads every XML part: a damaged one fails here first
                _count_xml_members(archive, budget)
        yield archive


def _count_xml_members(archive: zipfile.ZipFile, budget: ReadBudget) -> None:
    """Stream every member a parser could take for XML through the budget's counter: python-docx parses any
    part [Content_Types].xml calls XML (`word/c1` too), so the name says nothing."""
    for info in archive.infolist():
        budget.check()
        with archive.open(info) as member:
            head = member.read(64)
            if looks_like_xml(head):
                budget.count_xml(_chunks(member, head))


def _chunks(member, head: bytes) -> Iterator[bytes]:
    yield head
    while chunk := member.read(1 << 20):
        yield chunk


def read_docx(p: Path, budget: ReadBudget | None = None) -> str:
    """The body's paragraphs and tables in document order; a table row is its cells joined by tabs."""
    import docx
    from docx.table import Table

    budget = budget or ReadBudget(p.name)
    with _open_zip(p, "a Word document", budget), refused_if_broken(p.name, "a Word document"):
        lines = []
        for block in docx.Document(str(p)).iter_inner_content():
            budget.check()
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


def html_text(raw: bytes, name: str, budget: ReadBudget | None = None) -> str:
    """A web page's visible text laid out as a browser's text view would (blocks, lists, tables); its elements are
    counted against the document's budget before inscriptis builds its tree."""
    from inscriptis import get_text

    budget = budget or ReadBudget(name)
    text = decode_text(raw, name, budget)  # a binary file named .html is refused here, with the reason
    with refused_if_broken(name, "a web page"):
        budget.count_html(text)
        return get_text(text)


def read_html(p: Path, budget: ReadBudget | None = None) -> str:
    return html_text(_read_bounded(p), p.name, budget)


_XML_PARSER_OPTIONS = {"resolve_entities": False, "no_network": True}  # a document may not fetch or expand
_CONTAINER_NS = "{urn:oasis:names:tc:opendocument:xmlns:container}"
_OPF_NS = {"opf": "http://www.idpf.org/2007/opf"}


def read_epub(p: Path, budget: ReadBudget | None = None) -> str:
    """The chapters in reading order (the package's spine), each as a web page's text. Each part is counted
    against the budget where it is parsed (the container and package as XML, a chapter as HTML), whatever its name."""
    budget = budget or ReadBudget(p.name)
    with _open_zip(p, "an EPUB e-book", None) as archive, refused_if_broken(p.name, "an EPUB e-book"):
        container = _parse_counted(_read_member(archive, "META-INF/container.xml", budget), budget)
        package_path = container.find(f".//{_CONTAINER_NS}rootfile").get("full-path")
        package = _parse_counted(_read_member(archive, package_path, budget), budget)
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
            chapters.append(html_text(_read_member(archive, member, budget), f"{p.name}: {member}", budget).strip())
        return "\n\n".join(chapter for chapter in chapters if chapter)


def _read_member(archive: zipfile.ZipFile, name: str, budget: ReadBudget) -> bytes:
    budget.check()
    if archive.getinfo(name).file_size > MAX_XML_MEMBER_BYTES:
        raise budget.refused()
    return archive.read(name)


def _parse_counted(data: bytes, budget: ReadBudget):
    """An XML part's tree, once its elements are counted against the budget."""
    from lxml import etree

    budget.count_xml([data])
    return etree.fromstring(data, etree.XMLParser(**_XML_PARSER_OPTIONS))


def read_odt(p: Path, budget: ReadBudget | None = None) -> str:
    """The paragraphs and headings of an OpenDocument text (LibreOffice Writer), in document order."""
    from odf import teletype
    from odf.namespaces import TEXTNS
    from odf.opendocument import load

    blocks = {(TEXTNS, "p"), (TEXTNS, "h")}
    budget = budget or ReadBudget(p.name)
    with _open_zip(p, "an OpenDocument text", budget), refused_if_broken(p.name, "an OpenDocument text"):
        lines: list[str] = []

        def walk(node) -> None:
            for child in node.childNodes:
                budget.check()
                if getattr(child, "qname", None) in blocks:
                    lines.append(teletype.extractText(child))  # its spaces, tabs and line breaks included
                elif child.nodeType == child.ELEMENT_NODE:
                    walk(child)

        walk(load(str(p)).text)
        return "\n".join(lines)
