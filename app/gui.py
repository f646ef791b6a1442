"""Starts the Qt application: the main window on the embedded default model (or the last one opened).
The screenshot driver that drives this window through scenes is app/screenshots.py."""
from __future__ import annotations

import sys


def build_window(args=None):
    """The settings, the engine client (started) and the main window."""
    from app.conversations import ConversationStore
    from app.engine_client import EngineClient
    from app.settings import RunOverrides, Settings
    from ui.main_window import MainWindow

    settings = Settings.load()
    # command-line options win over the saved settings for this run, and are not saved into them
    overrides = RunOverrides(getattr(args, "model", None), getattr(args, "threads", None), getattr(args, "ctx", None))
    settings.use_cache_location()
    service = EngineClient(overrides.apply(settings.engine_settings()))
    window = MainWindow(settings, service, ConversationStore(), overrides=overrides)
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


if __name__ == "__main__":
    sys.exit(main())
