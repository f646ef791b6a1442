"""Starts the Qt application: the main window on the embedded default model (or the last one opened).

`python -m app.gui --screenshot PATH --scene chat|recall` is a debug aid: it drives the real window
(attach a long document, ask with "compare with exact"; or run the recall panel) and saves it with
QWidget.grab(). `--doc FILE --question Q [--question Q2]` asks about a document of your own (its first
`--doc-chars` characters) instead of the shipped corpus. The screenshots in README.md and docs/ are made
with it under Xvfb.
"""
from __future__ import annotations

import sys
import time


def build_window(args=None):
    """The settings, the engine client (started) and the main window."""
    from app.conversations import ConversationStore
    from app.engine_client import EngineClient
    from app.settings import Settings
    from ui.main_window import MainWindow

    settings = Settings.load()
    if args is not None:  # command-line options win over saved settings for this run
        if getattr(args, "model", None):
            settings.model_path = args.model
        if getattr(args, "threads", None):
            settings.threads = args.threads
    settings.use_cache_location()
    service = EngineClient(settings.engine_settings())
    window = MainWindow(settings, service, ConversationStore())
    service.start()
    return window


def _app():
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("RidgeFill Desktop")
    app.setOrganizationName("RidgeFill")
    return app


def main(args=None) -> int:
    import multiprocessing

    multiprocessing.freeze_support()  # the engine child of a frozen (PyInstaller) build
    import signal

    from PySide6.QtCore import QTimer

    app = _app()
    window = build_window(args)
    window.show()
    app.aboutToQuit.connect(window.shutdown)  # quit without a window close still joins the engine
    signal.signal(signal.SIGINT, lambda *_: app.quit())  # Ctrl+C in the terminal
    signal.signal(signal.SIGTERM, lambda *_: app.quit())
    wake = QTimer()  # let Python run its signal handlers while Qt's loop waits
    wake.timeout.connect(lambda: None)
    wake.start(250)
    return app.exec()


# ---- screenshots (debug aid) -----------------------------------------------------------------------
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


def screenshot(path: str, scene: str, doc_chars: int = 9000, lengths: str = "1600, 2048",
               depths: str = "0.1, 0.5, 0.9", doc_path: str | None = None, questions: list[str] | None = None) -> int:
    import tempfile
    from pathlib import Path

    from backend.corpus import corpus_texts
    from backend.demo import DEMO_FACT, DEMO_QUESTION

    app = _app()
    t_start = time.monotonic()
    window = build_window()
    window.resize(1500, 940)
    window.show()
    _log(f"window shown after {time.monotonic() - t_start:.1f} s")
    _wait(app, lambda: window.service.info is not None, 180, "the engine")
    _log(f"engine ready after {time.monotonic() - t_start:.1f} s: {window.engine_label.text()}")
    _wait(app, lambda: window._maps_task is None, 120, "the maps check")
    _log(f"maps: {window.controls.maps_label.text()} {window.controls.maps_reasons.text()[:200]}")
    window.new_conversation()
    if scene == "chat":
        if doc_path:
            doc = Path(tempfile.mkdtemp()) / Path(doc_path).name
            doc.write_text(Path(doc_path).read_text(encoding="utf-8")[:doc_chars], encoding="utf-8")
        else:
            text = "\n\n".join(corpus_texts())[:doc_chars]
            paras = text.split("\n\n")
            paras.insert(len(paras) // 4, DEMO_FACT)
            doc = Path(tempfile.mkdtemp()) / "harbour-archive.txt"
            doc.write_text("\n\n".join(paras), encoding="utf-8")
        window.controls.toggle.setChecked(True)
        window.controls.compare.setChecked(True)
        window.chat.attach_document(doc)
        _wait(app, lambda: window.chat._task_count is None and window.chat.last_count is not None, 120, "the count")
        _log(window.chat.count_label.text())
        for q in questions or (DEMO_QUESTION, "Who kept the lighthouse clock? Answer in one sentence."):
            window.chat.input.setPlainText(q)
            t0 = time.monotonic()
            window.chat.send()
            _wait(app, lambda: not window.chat.busy(), 900, "the answers")
            m = window.chat.conv.messages[-1]
            _log(f"answered in {time.monotonic() - t0:.1f} s: {m.content.strip()[:80]!r} "
                 f"timings={m.timings} exact={m.exact and m.exact['timings']}")
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
    app.processEvents()
    window.grab().save(path)
    _log(f"saved {path}")
    window.close()
    return 0


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(prog="python -m app.gui")
    p.add_argument("--screenshot", metavar="PATH", help="drive the window through a scene and save it")
    p.add_argument("--scene", choices=["chat", "recall"], default="chat")
    p.add_argument("--doc-chars", type=int, default=9000)
    p.add_argument("--lengths", default="1600, 2048")
    p.add_argument("--depths", default="0.1, 0.5, 0.9")
    p.add_argument("--doc", help="chat scene: a text file of your own to ask about (its first --doc-chars)")
    p.add_argument("--question", action="append", help="chat scene: a question to ask (repeatable)")
    a = p.parse_args()
    if a.screenshot:
        sys.exit(screenshot(a.screenshot, a.scene, a.doc_chars, a.lengths, a.depths, a.doc, a.question))
    sys.exit(main())
