"""Sources under each answer, the document pane, several documents per chat: real widgets, and the real
embedded model where an answer is needed (one engine process for this module)."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from app.conversations import Conversation, Document  # noqa: E402
from backend.corpus import corpus_texts  # noqa: E402
from tests.gui_helpers import attach, make_window, wait_count, wait_idle  # noqa: E402
# the chat tests' fixtures: a home folder, one engine process for this module, a window on it
from tests.test_gui_chat import home, service, window  # noqa: E402,F401

FACT = "The lighthouse keeper of Port Ellis is named Marta Quillfeather."


def write(path, text: str):
    path.write_text(text, encoding="utf-8")
    return path


def harbour(tmp_path, name="harbour.txt", chars=1200):
    """A few paragraphs of the shipped corpus with one fact in the middle (about 350 tokens)."""
    paras = [p for p in corpus_texts()[0][:chars].split("\n\n") if p.strip()]
    return write(tmp_path / name, "\n\n".join(paras[:2] + [FACT] + paras[2:]))


def ask(qtbot, w, question: str) -> None:
    w.chat.input.setPlainText(question)
    assert w.chat.send()
    wait_idle(qtbot, w)


def spy_requests(monkeypatch, w) -> list:
    sent = []
    submit = w.chat.service.submit

    def spy(kind, payload=None, **kw):
        if getattr(payload, "stop_loops", False):  # an answer's request (a count's has none)
            sent.append(payload)
        return submit(kind, payload, **kw)

    monkeypatch.setattr(w.chat.service, "submit", spy)
    return sent


def test_chips_appear_under_each_answer_and_a_click_selects_exactly_the_passage(qtbot, window, tmp_path):
    from PySide6.QtCore import Qt

    doc = harbour(tmp_path)
    assert attach(qtbot, window, doc)
    text = window.chat.conv.documents[0].text
    for n, question in enumerate(["Who is the lighthouse keeper of Port Ellis?", "And where is the harbour?"], 1):
        ask(qtbot, window, question)
        answer, widget = window.chat.conv.messages[-1], window.chat.view.messages[-1]
        assert answer.sources, f"answer {n} has no sources: {answer.timings.get('note')}"
        assert widget.chips is not None and len(widget.chips.chips) == len(answer.sources) <= 3
        assert "sources" in widget.meta.text()  # their cost, in the timings line
        for s, chip in zip(answer.sources, widget.chips.chips):
            assert s["document"] == "harbour.txt" and s["page"] is None and text[s["start"]:s["end"]] == s["text"]
            assert chip.text().startswith("harbour.txt ¶ ") and s["text"][:40] in chip.toolTip().replace("\n", " ")
    first = window.chat.view.messages[1].chips  # the first answer keeps its own
    assert first is not None and first is not window.chat.view.messages[-1].chips
    s = answer.sources[-1]
    qtbot.mouseClick(widget.chips.chips[-1], Qt.LeftButton)
    pane = window.chat.pane
    assert pane.isVisible() and pane.selected_text() == text[s["start"]:s["end"]]
    assert pane.highlighted_text() == text[s["start"]:s["end"]]
    assert pane.view.cursorRect().intersects(pane.view.viewport().rect())  # scrolled to it


def test_two_documents_go_with_each_request_and_removing_one_says_so(qtbot, window, tmp_path, monkeypatch):
    a = harbour(tmp_path, "a.txt", 700)
    b = write(tmp_path / "b.md", "# Ferries\n\nThe ferry to Saltmere leaves at seven minutes past nine.\n")
    sent = spy_requests(monkeypatch, window)
    assert attach(qtbot, window, a, b)  # as the file dialog's multi-select gives them
    wait_count(qtbot, window)
    both = window.chat.last_count.prompt_tokens
    assert window.chat.pane.list.count() == 2 and "2 documents" in window.chat.doc_label.text()
    ask(qtbot, window, "When does the ferry leave?")
    assert [d.name for d in sent[-1].documents] == ["a.txt", "b.md"]
    window.chat.pane.list.setCurrentRow(0)
    window.chat.pane.remove_btn.click()
    assert window.chat.view.messages[-1].text() == "Document a.txt removed: the next answer reads 1 document"
    assert [d.name for d in window.chat.conv.documents] == ["b.md"] and window.chat.pane.list.count() == 1
    window.chat.last_count = None
    wait_count(qtbot, window)
    assert window.chat.last_count.prompt_tokens < both - 100  # the count covers what is attached
    ask(qtbot, window, "And the ferry's name?")
    assert [d.name for d in sent[-1].documents] == ["b.md"]
    assert all(s["document"] == "b.md" for s in window.chat.conv.messages[-1].sources or [])


def test_a_folder_attaches_its_readable_documents_and_a_bad_file_keeps_the_others(qtbot, window, tmp_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    write(folder / "b.md", "Bees make honey.")
    write(folder / "a.txt", "Ants carry leaves.")
    (folder / "picture.png").write_bytes(b"\x89PNG\r\n")
    write(folder / "empty.txt", "  ")
    assert attach(qtbot, window, folder, tmp_path / "missing.txt")
    assert [d.name for d in window.chat.conv.documents] == ["a.txt", "b.md"]
    assert window.chat.conv.documents[0].path == str(folder / "a.txt")
    assert "missing.txt" in window.chat.notice.text()
    assert not attach(qtbot, window, folder / "a.txt")  # the same again
    assert "attached already" in window.chat.notice.text() and len(window.chat.conv.documents) == 2


def test_a_saved_conversation_with_two_documents_reopens_with_two(qtbot, window, service, tmp_path):
    pdf_like = Document("spec.pdf", "Page one text.\n\nPage two text.", (0, 16), str(tmp_path / "spec.pdf"))
    attach(qtbot, window, harbour(tmp_path, "a.txt", 500))
    window.chat.conv.documents.append(pdf_like)
    window.chat.conv.messages[:] = []
    window.chat.save()
    conv_id = window.chat.conv.id
    window.close()
    again = make_window(qtbot, service)  # a fresh window, as after a restart: it opens the newest chat
    assert again.chat.conv.id == conv_id
    assert [d.name for d in again.chat.conv.documents] == ["a.txt", "spec.pdf"]
    assert again.chat.conv.documents[1] == pdf_like and again.chat.pane.list.count() == 2


def test_a_pdf_source_opens_its_file_at_the_page(qtbot, tmp_path, monkeypatch):
    """The pane on its own: a PDF chip says "p. N"; "Open at page" opens the file's URL with #page=N."""
    from PySide6.QtGui import QDesktopServices

    from ui.document_pane import DocumentPane
    from ui.source_chips import SourceChips

    pdf = tmp_path / "spec.pdf"
    pdf.write_bytes(b"%PDF-1.4\n")
    text = "Chapter one.\n\nPage two holds the ferry times."
    docs = [Document("spec.pdf", text, (0, 14), str(pdf)), Document("n.txt", "A.\n\nB.\n\nC is here.")]
    source = {"document": "spec.pdf", "page": 2, "start": 14, "end": len(text), "text": text[14:], "score": 0.8}
    chips = SourceChips([source, {"document": "n.txt", "page": None, "start": 8, "end": 18, "text": "C is here.",
                                  "score": 0.5}], docs)
    assert [c.text() for c in chips.chips] == ["spec.pdf p. 2", "n.txt ¶ 3"]
    assert SourceChips([source], docs[:1]).chips[0].text() == "p. 2"
    opened = []
    monkeypatch.setattr(QDesktopServices, "openUrl", lambda url: opened.append(url.toString()) or True)
    pane = DocumentPane()
    qtbot.addWidget(pane)
    pane.set_documents(docs)
    chips.open_page.connect(pane.open_source_page)
    chips.open_page.emit(source)
    assert opened == [f"file://{pdf.resolve()}#page=2"] and pane.open_btn.text() == "Open at p. 2"
    pdf.unlink()  # moved away since: said, not opened
    assert not pane.open_page() and "attach it again" in pane.where.text() and len(opened) == 1


def test_the_pane_selects_by_character_whatever_the_text_holds(qtbot):
    """Offsets count Python characters; Qt counts UTF-16 units and reads CRLF as one break."""
    from ui.document_pane import DocumentPane

    text = "Emoji 😀 first.\r\nThen 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 words.\r\n\r\nThe passage we want is here. And after."
    start = text.index("The passage")
    end = text.index(" And after")
    pane = DocumentPane()
    qtbot.addWidget(pane)
    pane.set_documents([Document("other.txt", "x"), Document("odd.txt", text)])
    assert pane.show_source({"document": "odd.txt", "page": None, "start": start, "end": end})
    assert pane.list.currentRow() == 1 and pane.selected_text() == text[start:end] == pane.highlighted_text()
    assert not pane.show_source({"document": "gone.txt", "start": 0, "end": 1})
    assert "no longer attached" in pane.where.text()


def test_an_old_conversation_with_one_document_opens_in_the_pane(qtbot, window, service):
    old = {"id": "oldone", "title": "old", "created": 1.0, "updated": 2.0,
           "document": {"name": "d.txt", "text": "Old text.", "n_tokens": 3},
           "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    conv = Conversation.from_dict(old)
    assert window.chat.load_conversation(conv)
    assert window.chat.pane.list.count() == 1 and window.chat.pane.view.toPlainText() == "Old text."
    assert window.chat.view.messages[-1].chips is None  # an answer saved without sources shows none


def test_chips_wrap_in_a_narrow_chat_instead_of_widening_it(qtbot):
    from ui.chat_view import ChatView
    from ui.source_chips import SourceChips

    docs = [Document("a-rather-long-file-name.txt", "One.\n\nTwo."), Document("another-long-name.pdf", "x", (0,))]
    sources = [{"document": d.name, "page": p, "start": 0, "end": 1, "text": "x", "score": 1.0}
               for d, p in ((docs[0], None), (docs[1], 1), (docs[1], 1))]
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(300, 400)
    view.show()
    answer = view.add("assistant", "An answer.")
    answer.set_chips(SourceChips(sources, docs))
    qtbot.wait(100)
    chips = answer.chips.chips
    assert view.horizontalScrollBar().maximum() == 0, "the chips widened the chat"
    assert len({c.y() for c in chips}) > 1 and all(c.geometry().right() <= answer.chips.width() for c in chips)
    assert answer.chips.geometry().bottom() <= answer.height()  # the message grew to hold every row


def utf16(text: str, offset: int) -> int:
    """Where character `offset` is in UTF-16 units, as Qt counts (these texts have no CRLF)."""
    return len(text[:offset].encode("utf-16-le")) // 2


def test_the_pane_shades_the_text_made_exact_under_the_source_and_says_what_it_is(qtbot):
    from ui.document_pane import EXACT_LEGEND, EXACT_MARK, MARK_KIND, SOURCE_MARK, DocumentPane

    text = "Emoji 😀 first.\r\nThen 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 words.\r\n\r\nThe passage we want is here. And after."
    odd = [(text.index("𝔘"), text.index(" words")), (text.index("The passage"), len(text))]
    spans = [{"document": "odd.txt", "start": a, "end": b} for a, b in odd] + [
        {"document": "other.txt", "start": 0, "end": 1}]
    source = {"document": "odd.txt", "page": None, "start": text.index("The passage"), "end": text.index(" And")}
    pane = DocumentPane()
    qtbot.addWidget(pane)
    pane.set_documents([Document("other.txt", "x"), Document("odd.txt", text)])
    assert pane.show_source(source, spans)
    assert [m.cursor.selectedText() for m in pane.marks(EXACT_MARK)] == [text[a:b] for a, b in odd]
    marks = pane.view.extraSelections()
    assert marks[-1].format.property(MARK_KIND) == SOURCE_MARK  # drawn last: over the shading
    assert pane.highlighted_text() == text[source["start"]:source["end"]] == pane.selected_text()
    shade, mark = marks[0].format.background().color(), marks[-1].format.background().color()
    assert shade != mark and shade.lightnessF() != mark.lightnessF()
    assert not pane.legend.isHidden() and EXACT_LEGEND in pane.legend.text() and "2 spans" in pane.legend.text()
    assert "made exact" in pane.legend.toolTip()
    pane.show_document(0)  # the other document: its own span, no passage
    assert [m.cursor.selectedText() for m in pane.marks(EXACT_MARK)] == ["x"] and not pane.marks(SOURCE_MARK)
    pane.set_exact_spans([])  # an answer with none (an exact run): no shading, no legend
    assert not pane.marks(EXACT_MARK) and pane.legend.isHidden()


def contrast(a, b) -> float:
    """The WCAG contrast ratio of two colours."""
    def lum(c):
        ch = [x / 12.92 if x <= 0.03928 else ((x + 0.055) / 1.055) ** 2.4 for x in (c.redF(), c.greenF(), c.blueF())]
        return 0.2126 * ch[0] + 0.7152 * ch[1] + 0.0722 * ch[2]
    hi, lo = sorted((lum(a), lum(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


@pytest.mark.parametrize("base, ink, accent", [("#ffffff", "#000000", "#308cc6"),  # Fusion's light
                                               ("#2b2b2b", "#f0f0f0", "#2a82da")])  # a common dark palette
def test_the_exact_shade_shows_on_a_light_and_a_dark_palette_and_keeps_the_text_readable(qtbot, base, ink, accent):
    from PySide6.QtGui import QColor, QPalette

    from ui.document_pane import EXACT_MARK, DocumentPane

    pane = DocumentPane()
    qtbot.addWidget(pane)
    pane.set_documents([Document("a.txt", "Some text made exact.")])
    pane.set_exact_spans([{"document": "a.txt", "start": 5, "end": 9}])
    palette = QPalette(pane.palette())
    for role, colour in ((QPalette.Base, base), (QPalette.Text, ink), (QPalette.Highlight, accent)):
        palette.setColor(role, QColor(colour))
    pane.setPalette(palette)  # the palette changes while a document is shown: the shade follows it
    (mark,) = pane.marks(EXACT_MARK)
    shade = mark.format.background().color()
    assert contrast(shade, QColor(base)) >= 1.25, f"the shade {shade.name()} hardly shows on {base}"
    assert contrast(shade, QColor(ink)) >= 4.5, f"the text {ink} is hard to read on the shade {shade.name()}"
    assert shade.name() in pane.legend.text()  # the legend's swatch is the shade itself


def test_a_guided_answer_shades_what_ridgefill_made_exact_beside_its_sources(qtbot, window, tmp_path):
    """A real guided answer in the engine process: its spans cross to the window, are kept with the answer,
    shaded when it comes, and a click on its own chip shades them at their UTF-16 positions in a text with
    characters outside the BMP."""
    from PySide6.QtCore import Qt

    from ui.document_pane import EXACT_MARK

    paras = [p for p in corpus_texts()[0][:5200].split("\n\n") if p.strip()]  # ~1,250 tokens: guided runs
    doc = write(tmp_path / "long.txt", "\n\n".join(["Notes on 𝔎𝔢𝔩𝔡𝔢𝔯𝔴𝔦𝔠𝔨 😀."] + paras[:6] + [FACT] + paras[6:]))
    window.controls.toggle.setChecked(True)
    window.controls.mode_box.setCurrentIndex(window.controls.mode_box.findData("guided"))
    assert attach(qtbot, window, doc)
    window.chat.input.setPlainText("Who is the lighthouse keeper of Port Ellis?")
    assert window.chat.send()
    wait_idle(qtbot, window, 600)
    answer = window.chat.conv.messages[-1]
    assert answer.timings["mode"] == "guided" and answer.exact_spans and answer.sources, answer.timings
    spans, pane = answer.exact_spans, window.chat.pane
    assert pane.exact_spans == spans  # shaded as the answer came
    text = window.chat.conv.documents[0].text
    assert any(utf16(text, s["start"]) != s["start"] for s in spans)  # the positions differ from the offsets
    pane.set_exact_spans(None)
    chips = window.chat.view.messages[-1].chips  # the chips the window shows under the answer
    qtbot.mouseClick(chips.chips[0], Qt.LeftButton)
    shaded = pane.marks(EXACT_MARK)
    assert [(m.cursor.selectionStart(), m.cursor.selectionEnd()) for m in shaded] == [
        (utf16(text, s["start"]), utf16(text, s["end"])) for s in spans]
    assert [m.cursor.selectedText().replace("\u2029", "\n") for m in shaded] == [text[s["start"]:s["end"]] for s in spans]
    top = answer.sources[0]
    assert pane.highlighted_text() == text[top["start"]:top["end"]] and not pane.legend.isHidden()
