"""Starts the Qt application (placeholder window until the GUI issue)."""
from __future__ import annotations

import sys


def main(args) -> int:
    from PySide6.QtWidgets import QApplication, QLabel

    app = QApplication.instance() or QApplication(sys.argv[:1])
    label = QLabel("RidgeFill Desktop: the chat window arrives with the GUI issue.\n"
                   "Meanwhile use `python -m app chat --doc FILE \"question\"`.")
    label.setMargin(24)
    label.setWindowTitle("RidgeFill Desktop")
    label.show()
    return app.exec()
