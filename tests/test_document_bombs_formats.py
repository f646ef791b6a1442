"""Bombs inside every format (issue 65, item 4): each file is built here small on disk, read in a child whose address
space is capped at 2 GB, and must end within 30 s in a DocumentError that says what to do. The element count is taken
where a part is parsed, whatever its name; a web page has the same cap; a PDF's pages are bounded in content and
work; a folder in size; and reading can be stopped."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from backend.documents import read_document
from backend.errors import Cancelled
from test_document_bombs import write_odt_bomb
from test_document_formats import FACT, write_docx, write_epub, write_pdf

ROOT = Path(__file__).resolve().parents[1]
MEMORY_LIMIT = 2 << 30  # the child's address space: a reader that builds the bomb's tree dies here
BOMB_SECONDS = 30  # generous: each is refused in a few seconds on a shared 2-core machine

# Reads the path (a folder too) in a child with its address space capped, after setting the limits given as
# {"module:NAME": value}; prints what happened, the seconds and the peak RSS.
READ = """
import importlib, json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[2]), int(sys.argv[2])))
for key, value in json.loads(sys.argv[3]).items():
    module, name = key.split(":")
    setattr(importlib.import_module(module), name, value)
from backend.documents import read_documents
from backend.errors import DocumentError
started = time.monotonic()
try:
    read_documents([sys.argv[1]])
    outcome = "read"
except DocumentError as exc:
    outcome = "refused: " + str(exc)
except MemoryError:
    outcome = "MemoryError"
print(json.dumps({"outcome": outcome, "seconds": time.monotonic() - started,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def read_in_child(path: Path, limits: dict | None = None) -> dict:
    r = subprocess.run([sys.executable, "-c", READ, str(path), str(MEMORY_LIMIT), json.dumps(limits or {})], cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)
    print(path.name, got["outcome"][:80], f"{got['seconds']:.1f} s, {got['peak_mb']:.0f} MB")  # the measured figures
    return got


def repeated(member, unit: bytes, times: int) -> None:
    for _ in range(times // 100_000):
        member.write(unit * 100_000)


def write_epub_chapter_bomb(path: Path, elements: int) -> Path:
    """An .epub whose one chapter is a member named `c1` (no suffix: the old count went by name) that the package
    calls application/xhtml+xml, holding `elements` empty <b></b>."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("mimetype", "application/epub+zip", compress_type=zipfile.ZIP_STORED)
        z.writestr("META-INF/container.xml",
                   '<?xml version="1.0"?><container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:'
                   'container"><rootfiles><rootfile full-path="content.opf"/></rootfiles></container>')
        z.writestr("content.opf", '<package xmlns="http://www.idpf.org/2007/opf" version="3.0"><manifest><item id="c1" '
                                  'href="c1" media-type="application/xhtml+xml"/></manifest><spine><itemref idref="c1"/>'
                                  '</spine></package>')
        with z.open("c1", "w") as chapter:
            chapter.write(f"<html><body><p>{FACT}".encode())
            repeated(chapter, b"<b></b>", elements)
            chapter.write(b"</p></body></html>")
    return path


def write_docx_part_bomb(path: Path, elements: int) -> Path:
    """A real .docx whose main part is renamed `word/c1`, declared by an Override entry (python-docx parses it by
    its content type), holding `elements` empty paragraphs."""
    plain = write_docx(path.with_name("plain.docx"))
    renames = {"word/document.xml": "word/c1", "word/_rels/document.xml.rels": "word/_rels/c1.rels"}
    with zipfile.ZipFile(plain) as src, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as out:
        for info in src.infolist():
            data = src.read(info).replace(b"/word/document.xml", b"/word/c1").replace(b"word/document.xml", b"word/c1")
            if info.filename != "word/document.xml":
                out.writestr(renames.get(info.filename, info.filename), data)
                continue
            head, tail = data.split(b"<w:sectPr", 1)
            with out.open("word/c1", "w") as member:
                member.write(head)
                repeated(member, b"<w:p/>", elements)
                member.write(b"<w:sectPr" + tail)
    return path


def write_html_bomb(path: Path, elements: int) -> Path:
    """A web page of `elements` paragraphs (3 bytes each: a browser closes each <p> at the next)."""
    with open(path, "wb") as page:
        page.write(f"<html><body><p>{FACT}".encode())
        repeated(page, b"<p>", elements)
    return path


def write_objects(path: Path, objs: list[bytes]) -> Path:
    """A PDF of these objects, numbered from 1 (the first the catalog), with its cross-reference table."""
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for number, obj in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, obj)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1) + b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
    path.write_bytes(bytes(out))
    return path


def flate_stream(data: bytes, extra: bytes = b"") -> bytes:
    import zlib

    packed = zlib.compress(data, 9)
    return b"<< /Length %d /Filter /FlateDecode %s >>\nstream\n%s\nendstream" % (len(packed), extra, packed)


def write_pdf_content_bomb(path: Path, pages: int, content_mb: float, shows: bytes = b"") -> Path:
    """A PDF of `pages` pages (a page tree naming one page many times) whose one content stream decodes to
    `content_mb` MB of drawing that shows no text (pypdf scans it again for each page; with `shows`, a text operator
    that shows nothing, it parses it again for each page)."""
    fan = int(pages ** 0.5)
    return write_objects(path, [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [%s] /Count %d >>" % (b" ".join([b"3 0 R"] * fan), fan * fan),
        b"<< /Type /Pages /Parent 2 0 R /Kids [%s] /Count %d >>" % (b" ".join([b"4 0 R"] * fan), fan),
        b"<< /Type /Page /Parent 3 0 R /MediaBox [0 0 612 792] /Contents 5 0 R /Resources << /Font << /F1 6 0 R >> "
        b">> >>",
        flate_stream(shows + b"q Q\n" * int(content_mb * (1 << 18))),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"])


def write_pdf_form_bomb(path: Path, forms: int, operations: int) -> Path:
    """A one-page PDF of one line of text that then draws one form `forms` times, the form running `operations`
    operations that show no text, an empty string among them (pypdf parses the form again at each draw)."""
    text = b"BT /F1 12 Tf 72 720 Td (" + FACT.encode() + b") Tj ET\n"
    return write_objects(path, [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R /Resources << /Font << /F1 6 0 R >> "
        b"/XObject << /Fm 5 0 R >> >> >>",
        flate_stream(text + b"/Fm Do\n" * forms),
        flate_stream(b"BT /F1 12 Tf () Tj ET\n" + b"q Q\n" * (operations // 2),
                     b"/Type /XObject /Subtype /Form /BBox [0 0 612 792] /Resources << /Font << /F1 6 0 R >> >>"),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"])


def sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)  # zero bytes, none of them on disk
    return path


BOMBS = {
    "epub chapter c1, 8 million elements": (lambda d: write_epub_chapter_bomb(d / "book.epub", 8_000_000),
                                             "book.epub holds more XML than any document"),
    "docx part word/c1, 8 million elements": (lambda d: write_docx_part_bomb(d / "report.docx", 8_000_000),
                                               "report.docx holds more XML than any document"),
    "odt content.xml, 5 million elements": (lambda d: write_odt_bomb(d / "letter.odt", 5_000_000),
                                            "letter.odt holds more XML than any document"),
    "html, 6 million paragraphs": (lambda d: write_html_bomb(d / "page.html", 6_000_000),
                                   "page.html holds more XML than any document"),
    "pdf, 10,000 pages x 32 MB of drawing": (lambda d: write_pdf_content_bomb(d / "atlas.pdf", 10_000, 32),
                                             "atlas.pdf's pages draw more than 512 MB of content"),
    "txt, 500 MB of zero bytes": (lambda d: sparse(d / "notes.txt", 500 << 20), "notes.txt does not look like text"),
    "folder, 5 x 500 MB": (lambda d: [sparse(d / f"{i}.txt", 500 << 20) for i in range(5)] and d,
                           "The folder .* holds 2,500 MB of documents, more than the 2 GB a folder may hold"),
}


@pytest.mark.parametrize("bomb", list(BOMBS))
def test_a_bomb_in_each_format_is_refused_in_bounded_memory_and_time(tmp_path, bomb):
    write, refusal = BOMBS[bomb]
    (made := tmp_path / "bomb").mkdir()
    target = write(made)
    assert sum(os.stat(f).st_blocks * 512 for f in made.iterdir()) < 20 << 20  # small on disk
    got = read_in_child(target)
    assert re.match(f"refused: {refusal}", got["outcome"]), got
    assert re.search("Attach|save it again|export it", got["outcome"]) and "\n" not in got["outcome"]
    assert got["peak_mb"] < MEMORY_LIMIT >> 20 and got["seconds"] <= BOMB_SECONDS, got


@pytest.mark.parametrize("work", ["a form drawn 5,000 times", "a page named 10,000 times"])
def test_a_pdf_whose_work_grows_with_its_pages_or_forms_is_stopped_by_the_time_budget(tmp_path, work):
    # each page or form: about a million operations (under pypdf's 2 million tokens a stream) that show nothing
    bomb = (write_pdf_form_bomb(tmp_path / "work.pdf", forms=5_000, operations=1_000_000) if "form" in work else
            write_pdf_content_bomb(tmp_path / "work.pdf", 10_000, 2, shows=b"BT /F1 12 Tf () Tj ET\n"))
    got = read_in_child(bomb, {"backend.doc_budget:MAX_READ_SECONDS": 3})  # the real budget is minutes
    assert got["outcome"].startswith("refused: work.pdf took more than 3 seconds to read"), got
    assert got["seconds"] <= BOMB_SECONDS and got["peak_mb"] < MEMORY_LIMIT >> 20, got


def test_a_pdf_whose_forms_multiply_the_work_is_refused_by_its_operation_count(tmp_path, monkeypatch):
    from backend import doc_pdf

    monkeypatch.setattr(doc_pdf, "MAX_PDF_OPERATIONS", 500_000)
    with pytest.raises(Exception, match="forms.pdf's pages run more than 500,000 drawing operations") as err:
        read_document(write_pdf_form_bomb(tmp_path / "forms.pdf", forms=50, operations=100_000))
    assert type(err.value).__name__ == "DocumentError"


@pytest.mark.parametrize("kind", ["epub", "pdf forms", "txt"])
def test_reading_stops_soon_after_the_user_asks(tmp_path, kind):
    made = {"epub": lambda: write_epub_chapter_bomb(tmp_path / "book.epub", 1_500_000),
            "pdf forms": lambda: write_pdf_form_bomb(tmp_path / "forms.pdf", forms=20, operations=100_000),
            "txt": lambda: (tmp_path / "notes.txt").write_text(FACT * 300_000) and tmp_path / "notes.txt"}[kind]()
    asked = []

    def stop_after_a_few_questions() -> bool:
        asked.append(time.monotonic())
        return len(asked) > 3

    with pytest.raises(Cancelled, match="stopped reading"):
        read_document(made, cancelled=stop_after_a_few_questions)
    assert len(asked) == 4  # it stopped at the first True, between members, pages, chunks or elements


def test_files_of_ordinary_size_are_still_read_and_a_cancel_that_never_fires_changes_nothing(tmp_path):
    book = write_epub_chapter_bomb(tmp_path / "book.epub", 20_000)
    report = write_docx_part_bomb(tmp_path / "report.docx", 20_000)
    page = write_html_bomb(tmp_path / "page.html", 20_000)
    epub = write_epub(tmp_path / "plain.epub", {"one": f"<p>{FACT}</p>"})
    for made in (book, report, page, epub):
        assert FACT in read_document(made) == read_document(made, cancelled=lambda: False)
