"""The formats people have: each written here as a small real file, read back as text; PDF pages kept; the
unreadable refused with what to do."""
from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from backend import document_formats
from backend.documents import DOCUMENT_SUFFIXES, read_document, read_document_parts, read_documents
from backend.errors import DocumentError

FACT = "The daily limit is 500 requests."


def write_pdf(path, pages: list[str], *, user_password: str | None = None, owner_password: str = "owner"):
    """A PDF with one line of Helvetica text per page (pages given as "" are blank, like a scan's)."""
    from pypdf import PdfWriter
    from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

    writer = PdfWriter()
    font = DictionaryObject({NameObject("/Type"): NameObject("/Font"), NameObject("/Subtype"): NameObject("/Type1"),
                             NameObject("/BaseFont"): NameObject("/Helvetica")})
    for text in pages:
        page = writer.add_blank_page(612, 792)
        page[NameObject("/Resources")] = DictionaryObject(
            {NameObject("/Font"): DictionaryObject({NameObject("/F1"): font})})
        if text:
            stream = DecodedStreamObject()
            stream.set_data(f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode("latin-1"))
            page.replace_contents(stream)
    if user_password is not None:
        writer.encrypt(user_password, owner_password, algorithm="AES-128")
    writer.write(path)
    return path


def write_docx(path):
    import docx

    document = docx.Document()
    document.add_heading("Service manual", level=1)
    paragraph = document.add_paragraph("The daily limit is ")
    paragraph.add_run("500").bold = True
    paragraph.add_run(" requests.")
    table = document.add_table(rows=2, cols=2)
    for r, row in enumerate([("Region", "Limit"), ("Europe", "500")]):
        for c, value in enumerate(row):
            table.cell(r, c).text = value
    document.add_paragraph("After the table.")
    document.save(path)
    return path


def write_epub(path, chapters: dict[str, str], spine_order: list[str] | None = None):
    """An EPUB 3 as the spec lays it out: mimetype first and stored, container, package, chapters.
    `spine_order`: the chapters' names in reading order (default: as given)."""
    # the manifest lists the chapters backwards: the spine, not the manifest, gives the reading order
    items = "".join(f'<item id="{n}" href="text/{n}.xhtml" media-type="application/xhtml+xml"/>'
                    for n in reversed(chapters))
    items += '<item id="cover" href="cover.png" media-type="image/png"/>'
    spine = '<itemref idref="cover"/>' + "".join(f'<itemref idref="{n}"/>' for n in spine_order or chapters)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("mimetype", "application/epub+zip", compress_type=zipfile.ZIP_STORED)
        z.writestr("META-INF/container.xml",
                   '<?xml version="1.0"?><container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:'
                   'container"><rootfiles><rootfile full-path="OEBPS/content.opf" media-type="application/'
                   'oebps-package+xml"/></rootfiles></container>')
        z.writestr("OEBPS/content.opf",
                   '<?xml version="1.0" encoding="utf-8"?><package xmlns="http://www.idpf.org/2007/opf" '
                   f'version="3.0"><manifest>{items}</manifest><spine>{spine}</spine></package>')
        z.writestr("OEBPS/cover.png", b"\x89PNG\r\n\x1a\n" + bytes(64))
        for name, body in chapters.items():
            z.writestr(f"OEBPS/text/{name}.xhtml",
                       '<?xml version="1.0" encoding="utf-8"?><html xmlns="http://www.w3.org/1999/xhtml">'
                       f"<head><title>{name}</title></head><body>{body}</body></html>")
    return path


def write_odt(path):
    from odf import text
    from odf.opendocument import OpenDocumentText

    document = OpenDocumentText()
    document.text.addElement(text.H(outlinelevel=1, text="Service manual"))
    paragraph = text.P(text="The daily limit is")
    paragraph.addElement(text.S(c=1))
    paragraph.addText("500 requests.")
    document.text.addElement(paragraph)
    document.text.addElement(text.P(text="Second paragraph."))
    document.save(str(path))
    return path


def test_a_word_document_reads_as_text_in_order_with_its_table(tmp_path):
    text = read_document(write_docx(tmp_path / "manual.docx"))
    assert FACT in text  # the bold run is part of its sentence
    order = [text.index(part) for part in ("Service manual", FACT, "Region\tLimit", "After the table.")]
    assert order == sorted(order)
    assert "Europe\t500" in text


def test_merged_table_cells_are_read_once_however_many_columns_the_file_says_they_span(tmp_path, monkeypatch):
    import docx
    import docx.table

    document = docx.Document()
    table = document.add_table(rows=3, cols=2)
    for r, row in enumerate([("Region", "Limit"), ("", "500"), ("", "600")]):
        for c, value in enumerate(row):
            table.cell(r, c).text = value
    table.cell(1, 0).merge(table.cell(2, 0)).text = "Europe"  # Europe spans two rows
    table.rows[1]._tr.tc_lst[1].grid_span = 2_000_000_000  # and "500" says it spans two billion columns
    document.save(tmp_path / "merged.docx")
    # python-docx's row.cells would build a tuple of two billion cells (16 GB)
    monkeypatch.setattr(docx.table._Row, "cells", property(lambda row: pytest.fail("row.cells expands merged cells")))
    text = read_document(tmp_path / "merged.docx")
    assert text.splitlines() == ["Region\tLimit", "Europe\t500", "\t600"]


def test_a_web_page_reads_as_its_visible_text(tmp_path):
    page = tmp_path / "saved page.html"
    page.write_text("<html><head><title>Manual</title><style>p {color: red}</style><script>var secret = 1;"
                    f"</script></head><body><h1>Limits</h1><p>The daily limit is <b>500</b> requests.</p>"
                    "<ul><li>first</li><li>second</li></ul></body></html>", encoding="utf-8")
    text = read_document(page)
    assert FACT in text
    assert "secret" not in text and "color" not in text  # scripts and styles are not text
    assert text.index("Limits") < text.index(FACT) < text.index("first") < text.index("second")


def test_an_epub_reads_its_chapters_in_reading_order(tmp_path):
    book = write_epub(tmp_path / "book.epub", {"one": "<h1>Chapter one</h1><p>It begins.</p>",
                                               "two": f"<h1>Chapter two</h1><p>{FACT}</p>"})
    text = read_document(book)
    assert text.index("Chapter one") < text.index("It begins.") < text.index("Chapter two") < text.index(FACT)
    assert "PNG" not in text  # the cover image in the spine holds no text


def test_a_chapter_the_spine_names_many_times_is_read_once(tmp_path):
    # a hostile spine could name one large chapter 100,000 times: the archive's size check counts it once
    book = write_epub(tmp_path / "book.epub", {"one": "<p>It begins.</p>", "two": f"<p>{FACT}</p>"},
                      spine_order=["one"] + ["two"] * 1000)
    text = read_document(book)
    assert text.count(FACT) == 1 and text.index("It begins.") < text.index(FACT)


def test_an_opendocument_text_reads_its_headings_and_paragraphs(tmp_path):
    text = read_document(write_odt(tmp_path / "manual.odt"))
    assert text.splitlines() == ["Service manual", FACT, "Second paragraph."]


def test_a_pdf_keeps_where_each_page_starts(tmp_path):
    pages = ["First page says hello.", FACT, "Third page ends it."]
    doc = read_document_parts(write_pdf(tmp_path / "spec.pdf", pages))
    assert doc.name == "spec.pdf"
    assert len(doc.page_starts) == 3 and doc.page_starts[0] == 0
    for number, (start, page_text) in enumerate(zip(doc.page_starts, pages), start=1):
        assert doc.text[start:].startswith(page_text)
        assert doc.page_at(doc.text.index(page_text)) == number
        assert doc.page_at(doc.text.index(page_text) + len(page_text) - 1) == number
    assert read_document(tmp_path / "spec.pdf") == doc.text  # today's callers get the same text


def test_text_formats_have_no_pages(tmp_path):
    (tmp_path / "notes.txt").write_text(FACT)
    doc = read_document_parts(tmp_path / "notes.txt")
    assert doc.page_starts == () and doc.page_at(3) is None


def test_a_pdf_with_a_password_is_refused_with_what_to_do(tmp_path):
    with pytest.raises(DocumentError) as err:
        read_document(write_pdf(tmp_path / "locked.pdf", [FACT], user_password="secret"))
    assert "locked.pdf is protected with a password" in str(err.value)
    assert "save or print a copy without one" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_pdf_locked_only_against_editing_opens_as_a_viewer_would(tmp_path):
    # an owner password alone (the user's is empty): viewers open it without asking, and so do we
    assert FACT in read_document(write_pdf(tmp_path / "restricted.pdf", [FACT], user_password=""))


def test_a_scanned_pdf_without_a_text_layer_is_refused_with_ocr_advice(tmp_path):
    with pytest.raises(DocumentError, match=r"scan.pdf has no text layer.*run OCR on it, e\.g\. ocrmypdf"):
        read_document(write_pdf(tmp_path / "scan.pdf", ["", ""]))


@pytest.mark.parametrize("suffix, kind", [(".docx", "Word document"), (".epub", "EPUB e-book"),
                                          (".odt", "OpenDocument text")])
def test_a_damaged_archive_is_refused_with_what_to_do(tmp_path, suffix, kind):
    broken = tmp_path / f"broken{suffix}"
    broken.write_bytes(b"PK\x03\x04" + bytes(range(200)))
    with pytest.raises(DocumentError, match=f"broken{suffix} is damaged or is not really an? {kind}") as err:
        read_document(broken)
    assert "save it again" in str(err.value) and "\n" not in str(err.value)
    # a sound zip without the format's parts inside
    hollow = tmp_path / f"hollow{suffix}"
    with zipfile.ZipFile(hollow, "w") as z:
        z.writestr("readme.txt", "not a document")
    with pytest.raises(DocumentError, match=f"hollow{suffix} could not be read as an? {kind}"):
        read_document(hollow)


@pytest.mark.parametrize("suffix", [".docx", ".epub", ".odt"])
def test_an_archive_needing_a_newer_zip_version_is_refused(tmp_path, suffix):
    """The long fuzz run's finding (docs/HARDENING.md): a central directory entry whose "version needed to
    extract" reads 16.0 made zipfile raise NotImplementedError, past every handler."""
    made = {".docx": write_docx, ".odt": write_odt,
            ".epub": lambda p: write_epub(p, {"one": f"<p>{FACT}</p>"})}[suffix](tmp_path / f"new{suffix}")
    data = bytearray(made.read_bytes())
    central = data.rfind(b"PK\x01\x02")  # the last central directory entry: its version needed at +6
    data[central + 6:central + 8] = (160).to_bytes(2, "little")
    made.write_bytes(bytes(data))
    with pytest.raises(DocumentError, match=f"new{suffix} is damaged or is not really") as err:
        read_document(made)
    assert "zip file version 16.0" in str(err.value) and "\n" not in str(err.value)


def test_an_archive_that_would_unpack_to_too_much_is_refused(tmp_path, monkeypatch):
    manual = write_docx(tmp_path / "manual.docx")
    monkeypatch.setattr(document_formats, "MAX_UNPACKED_BYTES", 1000)
    with pytest.raises(DocumentError, match="manual.docx would unpack to more than"):
        read_document(manual)


@pytest.mark.parametrize("name", ["huge.txt", "huge.html"])
def test_a_text_file_larger_than_any_context_is_refused_before_it_is_read(tmp_path, monkeypatch, name):
    (tmp_path / name).write_text(FACT * 100)
    monkeypatch.setattr(document_formats, "MAX_UNPACKED_BYTES", 1000)
    monkeypatch.setattr(Path, "read_bytes", lambda p: pytest.fail("read whole"))
    with pytest.raises(DocumentError, match=f"{name} is 0 MB of text: far more than any model's context"):
        read_document(tmp_path / name)


def test_a_file_or_folder_the_system_will_not_read_is_refused_with_what_to_do(tmp_path, monkeypatch):
    (tmp_path / "notes.txt").write_text(FACT)
    (tmp_path / "manual.pdf").write_bytes(b"%PDF-1.4")

    def denied(*args, **kw):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_bytes", denied)
    monkeypatch.setattr("pypdf.PdfReader.__init__", denied)
    for name in ("notes.txt", "manual.pdf"):
        with pytest.raises(DocumentError, match=f"{name} could not be read \\(Permission denied\\). Check"):
            read_document(tmp_path / name)
    monkeypatch.setattr(Path, "iterdir", denied)
    with pytest.raises(DocumentError, match="could not be read \\(Permission denied\\). Check that you may open"):
        read_documents([tmp_path])


def test_a_binary_file_named_html_is_refused(tmp_path):
    page = tmp_path / "image.htm"
    page.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8)
    with pytest.raises(DocumentError, match="image.htm does not look like text"):
        read_document(page)


def test_every_format_read_is_offered_by_the_window():
    pytest.importorskip("PySide6")
    from ui.chat_documents import DOC_FILTER, DOC_SUFFIXES

    assert {".pdf", ".docx", ".html", ".htm", ".epub", ".odt", ".txt", ".md"} <= set(DOCUMENT_SUFFIXES)
    for suffix in DOCUMENT_SUFFIXES:
        assert suffix in DOC_SUFFIXES and f"*{suffix}" in DOC_FILTER  # the drop target and the file dialog


def write_page_tree(path, levels: int, fan: int):
    """A PDF of a few KB whose page tree names one branch `fan` times at each of `levels` levels: fan ** levels
    pages listed, each the same page of one line."""
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>"]
    for level in range(levels):
        node, parent = 2 + level, b"" if level == 0 else b" /Parent %d 0 R" % (1 + level)
        kids = b" ".join([b"%d 0 R" % (node + 1)] * fan)
        objs.append(b"<< /Type /Pages%s /Kids [%s] /Count %d >>" % (parent, kids, fan ** (levels - level)))
    page = 2 + levels
    text = b"BT /F1 12 Tf 72 720 Td (" + FACT.encode() + b") Tj ET"
    objs += [b"<< /Type /Page /Parent %d 0 R /MediaBox [0 0 612 792] /Contents %d 0 R /Resources << /Font << /F1 "
             b"%d 0 R >> >> >>" % (page - 1, page + 1, page + 2),
             b"<< /Length %d >>\nstream\n%s\nendstream" % (len(text), text),
             b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for number, obj in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, obj)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1) + b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
    Path(path).write_bytes(bytes(out))
    return path


def test_a_pdf_listing_more_pages_than_any_context_holds_is_refused_before_they_are_listed(tmp_path):
    assert read_document_parts(write_page_tree(tmp_path / "book.pdf", levels=1, fan=3)).text.count(FACT) == 3
    for levels, fan in ((2, 300), (3, 300)):  # 90,000 pages from 4 KB; 27 million (pypdf would need ~20 GB)
        bomb = write_page_tree(tmp_path / f"bomb{levels}.pdf", levels, fan)
        assert bomb.stat().st_size < 8_000
        with pytest.raises(DocumentError, match="more than 10,000 pages.*Attach the pages you want"):
            read_document(bomb)


def test_a_pdf_whose_pages_hold_more_text_than_any_context_is_refused(tmp_path, monkeypatch):
    pdf = write_page_tree(tmp_path / "book.pdf", levels=1, fan=3)  # 3 pages of FACT's 32 characters
    monkeypatch.setattr(document_formats, "MAX_UNPACKED_BYTES", 2 * len(FACT))
    with pytest.raises(DocumentError, match="more than .* characters of text"):
        read_document(pdf)
    monkeypatch.setattr(document_formats, "MAX_UNPACKED_BYTES", 3 * len(FACT))
    assert read_document(pdf).count(FACT) == 3
