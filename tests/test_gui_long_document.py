"""A huge text in the document pane (issue 55, item 6): it is laid out a part at a time, so attaching it keeps
the window responsive, and a source far into it still scrolls to and highlights its passage."""
from __future__ import annotations

import time

from app.conversations import Document
from ui.document_pane import EXACT_MARK, DocumentPane
from ui.text_window import WINDOW_CHARS

LINE = "The harbour log goes on about tides, ferries and the weather at Port Ellis.\n"
PASSAGE = "The lighthouse keeper saw fog rolling in from the north on Tuesday."


def huge_text(chars: int, at: int) -> tuple[str, int]:
    """About `chars` characters of log lines with PASSAGE on a line of its own near `at`; the text and where."""
    before = LINE * (at // len(LINE))
    return before + PASSAGE + "\n" + LINE * ((chars - at) // len(LINE)), len(before)


def held(pane: DocumentPane) -> int:
    return pane.view.document().characterCount()


def test_a_huge_text_is_laid_out_a_part_at_a_time_and_a_far_source_still_highlights(qtbot):
    text, start = huge_text(40_000_000, 39_000_000)
    end = start + len(PASSAGE)
    pane = DocumentPane()
    qtbot.addWidget(pane)
    pane.resize(600, 500)
    pane.show()
    t0 = time.perf_counter()
    pane.set_documents([Document("log.txt", text)])
    qtbot.wait(10)  # the event loop runs: the view's layout is done
    attach_s = time.perf_counter() - t0
    assert held(pane) <= WINDOW_CHARS + 1, f"{held(pane):,} characters laid out at once"
    assert attach_s < 5.0, f"the window was busy {attach_s:.1f} s"
    assert pane.later_btn.isVisible() and not pane.earlier_btn.isEnabled() and "showing 0–" in pane.where.text()

    assert pane.show_source({"document": "log.txt", "page": None, "start": start, "end": end})
    qtbot.wait(10)
    assert held(pane) <= WINDOW_CHARS + 1
    assert pane.highlighted_text() == PASSAGE == pane.selected_text()
    assert pane.view.cursorRect().intersects(pane.view.viewport().rect())  # scrolled to it
    assert pane.earlier_btn.isEnabled() and pane.later_btn.isEnabled()

    pane.set_exact_spans([{"document": "log.txt", "start": start - 10, "end": end},
                          {"document": "log.txt", "start": 100, "end": 200}])  # the second is in another part
    marks = pane.marks(EXACT_MARK)
    assert len(marks) == 1 and marks[0].cursor.selectedText().endswith(PASSAGE)

    shown = pane._window
    pane.show_later()  # the part after: it joins this one, and the passage leaves the view
    assert pane._window[0] <= shown[1] < pane._window[1] and held(pane) <= WINDOW_CHARS + 1
    assert pane.highlighted_text() == ""
    pane.show_earlier()  # and back: the part before it holds the passage again
    assert pane._window[0] < start and end <= pane._window[1] and pane.highlighted_text() == PASSAGE
