"""Starts the Qt application: the main window on the embedded default model (or the last one opened).

`python -m app.gui --screenshot PATH [--scene chat|recall]` is a debug aid that drives the real window
and saves it with QWidget.grab() (used for the README screenshots under Xvfb).
"""
from __future__ import annotations

import sys


def build_window(args=None):
    """The settings, the engine service (started) and the main window (shown)."""
    from app.conversations import ConversationStore
    from app.engine_service import EngineService
    from app.settings import Settings
    from ui.main_window import MainWindow

    settings = Settings.load()
    if args is not None:  # command-line options win over saved settings for this run
        if getattr(args, "model", None):
            settings.model_path = args.model
        if getattr(args, "threads", None):
            settings.threads = args.threads
    settings.apply_environment()
    service = EngineService(_engine_settings(settings))
    window = MainWindow(settings, service, ConversationStore())
    service.start()
    return window


def _engine_settings(settings):
    from app.engine_service import EngineSettings
    from backend.model_file import embedded_model_path

    return EngineSettings(model_path=settings.model_path or str(embedded_model_path()), n_ctx=settings.n_ctx,
                          n_threads=settings.threads or None)


def main(args=None) -> int:
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("RidgeFill Desktop")
    app.setOrganizationName("RidgeFill")
    window = build_window(args)
    window.show()
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
