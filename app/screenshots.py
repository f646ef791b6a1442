"""A debug aid that drives the real window and saves it with QWidget.grab(): the screenshots in README.md
and docs/ are made with it under Xvfb.

`python -m app.screenshots --screenshot PATH --scene chat|recall|reopen|sources`: attach a long document and
ask with "compare with exact"; run the recall panel; or ask, wait until the document is exact, and ask again
in a new window on a new engine process (PATH-1 and PATH-2). `--doc FILE --question Q [--question Q2]`
asks about a document of your own (its first `--doc-chars` characters) instead of the shipped corpus.
`--scene sources --doc A.pdf --doc B ... --question Q ...` attaches the files whole (any format the app
reads), asks each question, then clicks the first source on a PDF page (PATH-1) and the last in another
document (PATH-2): the sources under each answer and the passage highlighted in the document pane.
"""
from __future__ import annotations

import sys
import time

from app.gui import _app, build_window


def _wait(app, cond, timeout_s: float, what: str) -> float:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"timed out waiting for {what}")
        app.processEvents()
        time.sleep(0.02)
    return time.monotonic() - t0


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _open_window(app, model: str | None = None, split: int | None = None):
    """A new main window on a new engine process (on `model` where given), shown, the engine ready, the
    split set (where given) and the maps checked."""
    from types import SimpleNamespace

    t_start = time.monotonic()
    window = build_window(SimpleNamespace(model=model, threads=None))
    window.resize(1500, 940)
    window.show()
    _log(f"window shown after {time.monotonic() - t_start:.1f} s")
    _wait(app, lambda: window.service.info is not None, 600, "the engine")  # a loaded machine: minutes
    _log(f"engine ready after {time.monotonic() - t_start:.1f} s: {window.engine_label.text()}")
    if split is not None:
        window.controls.slider.setValue(split)
        _wait(app, lambda: not window.controls._settle.isActive(), 10, "the split to settle")
    _wait(app, lambda: window.maps_tasks.check_task is None, 600, "the maps check")
    _log(f"maps: {window.controls.maps_label.text()} {window.controls.maps_reasons.text()[:200]}")
    window.new_conversation()
    return window


def _grab(app, window, path) -> None:
    """Save the window once posted layout changes have settled (a label just set is laid out later)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < 0.5:
        app.processEvents()
        time.sleep(0.02)
    window.grab().save(str(path))
    _log(f"saved {path}")


def _document(doc_path: str | None, doc_chars: int):
    """The file the chat scenes attach: the first `doc_chars` of `doc_path`, else the demo's document whole."""
    import tempfile
    from pathlib import Path

    from backend.demo import DEMO_SOURCE, demo_text

    if doc_path:
        doc = Path(tempfile.mkdtemp()) / Path(doc_path).name
        doc.write_text(Path(doc_path).read_text(encoding="utf-8")[:doc_chars], encoding="utf-8")
        return doc
    doc = Path(tempfile.mkdtemp()) / f"{DEMO_SOURCE}.txt"
    doc.write_text(demo_text(), encoding="utf-8")
    return doc


def _attach(app, window, doc, compare: bool) -> None:
    window.controls.toggle.setChecked(True)
    window.controls.compare.setChecked(compare)
    window.chat.attach_document(doc)
    _wait(app, lambda: not window.chat.busy(), 120, "the reading")
    _wait(app, lambda: window.chat._task_count is None and window.chat.last_count is not None, 120, "the count")
    _log(window.chat.count_label.text())


def _ask(app, window, question: str):
    """Ask `question` in the chat and wait for the answer (and its exact run); the answer's message."""
    window.chat.input.setPlainText(question)
    t0 = time.monotonic()
    window.chat.send()
    _wait(app, lambda: not window.chat.busy(), 3600, "the answers")  # a busy 2-core machine: minutes
    m = window.chat.conv.messages[-1]
    _log(f"answered in {time.monotonic() - t0:.1f} s: {m.content.strip()[:80]!r} "
         f"timings={m.timings} exact={m.exact and m.exact['timings']}")
    return m


def _exact_and_saved(window, statuses: list) -> bool:
    """The status bar says "document N tokens, exact" and the engine saved it so (an exact save
    still pending is lost when the window closes)."""
    st = statuses[-1] if statuses else None
    return (window.document_label.text().endswith(" tokens, exact") and st is not None and st.saved
            and st.exact_rows >= st.tokens > 0)


def _reopen(app, path: str, doc, questions: list[str]) -> None:
    """The prompt cache on disk: ask (RidgeFill, no comparison), wait until the idle work made the
    document exact and saved it, grab PATH-1; then a new window on a new engine process asks again
    about the same document, whose prompt should come from the disk cache; grab PATH-2."""
    from pathlib import Path

    first = _open_window(app)
    statuses = []  # the engine's DocumentStatus as it goes (saved, exact rows)
    first.service.document_changed.connect(statuses.append)
    _attach(app, first, doc, compare=False)
    _ask(app, first, questions[0])
    waited = _wait(app, lambda: _exact_and_saved(first, statuses), 3600, "the idle refinement")
    _log(f"{first.document_label.text()!r} and saved after {waited:.1f} s: {statuses[-1]}")
    p = Path(path)
    _grab(app, first, p.with_name(f"{p.stem}-1{p.suffix}"))
    first.close()  # saves, stops and joins its engine process
    second = _open_window(app)
    _attach(app, second, doc, compare=False)
    m = _ask(app, second, questions[1 % len(questions)])
    cache_n, prompt_n = m.timings["cache_n"], m.timings["prompt_n"]
    share = cache_n / max(1, cache_n + prompt_n)
    _log(f"reopened: cache_n={cache_n} of {cache_n + prompt_n} prompt tokens ({share:.0%}), "
         f"TTFT {m.timings['ttft_ms']:.0f} ms" + ("" if share >= 0.9 else " -- NOT from the disk cache"))
    _grab(app, second, p.with_name(f"{p.stem}-2{p.suffix}"))
    second.close()


def _sources(app, window, path: str, docs: list[str], questions: list[str], max_tokens: int | None) -> None:
    """Attach `docs` whole, ask each question (answers up to `max_tokens`), and grab the window after
    clicking the first source on a PDF page (PATH-1) and the last one in another document (PATH-2)."""
    from pathlib import Path

    # RidgeFill where the model has usable maps, else exact: the sources come in every mode
    window.controls.toggle.setChecked(window.controls.maps_status in ("verified", "warning"))
    window.controls.compare.setChecked(False)
    window.chat.attach_documents(docs)
    _wait(app, lambda: not window.chat.busy(), 120, "the reading")
    if len(window.chat.conv.documents) < len(docs):
        raise SystemExit(f"could not attach {docs}: {window.chat.notice.text()}")
    _wait(app, lambda: window.chat._task_count is None and window.chat.last_count is not None, 120, "the count")
    _log(window.chat.count_label.text())
    if max_tokens:
        window.generation.max_tokens_box.setValue(max_tokens)
    chips = []  # (chip, source) of every answer, in order
    for q in questions:
        m = _ask(app, window, q)
        _log(f"sources: {[(s['document'], s['page'], s['text'][:60]) for s in m.sources or []]}")
        widget = window.chat.view.messages[-1]
        chips += list(zip(widget.chips.chips, m.sources)) if widget.chips is not None else []
    if not chips:
        raise SystemExit("no answer came with sources: nothing to click")
    p = Path(path)
    on_page = [c for c in chips if c[1]["page"] is not None] or chips  # a PDF page first, then another
    elsewhere = [c for c in chips if c[1]["page"] is None and c[1]["document"] != on_page[0][1]["document"]]
    for n, (chip, _source) in enumerate((on_page[0], (elsewhere or chips)[-1]), 1):
        window.chat.view.ensureWidgetVisible(chip, 0, 120)  # the answer it is under, in view
        chip.click()
        _log(f"clicked {chip.text()!r}: {window.chat.pane.where.text()}")
        _grab(app, window, p.with_name(f"{p.stem}-{n}{p.suffix}"))


def screenshot(path: str, scene: str, doc_chars: int = 9000, lengths: str = "1600, 2048",
               depths: str = "0.1, 0.5, 0.9", doc_paths: list[str] | None = None,
               questions: list[str] | None = None, model: str | None = None, split: int | None = None,
               max_tokens: int | None = None) -> int:
    from backend.demo import FOLLOW_UP, demo_question

    doc_paths = doc_paths or []
    doc_path = doc_paths[0] if doc_paths else None  # the chat and reopen scenes ask about one
    app = _app()
    questions = questions or [demo_question().question, FOLLOW_UP]
    if scene == "reopen":
        _reopen(app, path, _document(doc_path, doc_chars), questions)
        return 0
    window = _open_window(app, model, split)
    if scene == "sources":
        try:
            _sources(app, window, path, doc_paths, questions, max_tokens)
        finally:  # also when it stops early: the engine process ends with the window
            window.close()
        return 0
    if scene == "chat":
        _attach(app, window, _document(doc_path, doc_chars), compare=True)
        for q in questions:
            _ask(app, window, q)
    elif scene == "recall":
        window.controls.toggle.setChecked(True)
        window.tabs.setCurrentWidget(window.recall)
        window.recall.lengths.setText(lengths)
        window.recall.depths.setText(depths)
        window.recall.haystack.setCurrentIndex(window.recall.haystack.findData("corpus"))
        t0 = time.monotonic()
        window.recall.run()
        _wait(app, lambda: window.recall._task is None, 1800, "the recall run")
        _log(f"recall done in {time.monotonic() - t0:.1f} s: {window.recall.status.text()[:300]}")
    _grab(app, window, path)
    window.close()
    return 0


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(prog="python -m app.screenshots")
    p.add_argument("--screenshot", metavar="PATH", required=True, help="drive the window through a scene and save it")
    p.add_argument("--scene", choices=["chat", "recall", "reopen", "sources"], default="chat")
    p.add_argument("--doc-chars", type=int, default=9000)
    p.add_argument("--lengths", default="1600, 2048")
    p.add_argument("--depths", default="0.1, 0.5, 0.9")
    p.add_argument("--doc", action="append", help="chat and reopen scenes: a text file of your own to ask about "
                   "(its first --doc-chars); sources scene: a document to attach whole (repeatable)")
    p.add_argument("--question", action="append", help="chat and reopen scenes: a question to ask (repeatable)")
    p.add_argument("--model", help="chat and recall scenes: a GGUF file to open (default: the last one opened)")
    p.add_argument("--split", type=int, help="chat and recall scenes: the split to set on the slider")
    p.add_argument("--max-tokens", type=int, help="sources scene: the longest answer")
    a = p.parse_args()
    sys.exit(screenshot(a.screenshot, a.scene, a.doc_chars, a.lengths, a.depths, a.doc, a.question, a.model,
                        a.split, a.max_tokens))
