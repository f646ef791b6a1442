"""Logging to a file in the user log dir, and to stderr when there is one (windowed builds have none)."""
from __future__ import annotations

import logging
import sys
from logging.handlers import RotatingFileHandler

from backend.private_files import private_opener
from backend.user_paths import log_dir


class PrivateRotatingFileHandler(RotatingFileHandler):
    """The log names the user's documents and questions: each file it opens (a rotation's too) is 0600."""

    def _open(self):
        return open(self.baseFilename, self.mode, encoding=self.encoding, errors=self.errors, opener=private_opener)


def setup_logging(verbose: bool = False) -> None:
    root = logging.getLogger()
    if getattr(root, "_ridgefill_ready", False):
        return
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        fh = PrivateRotatingFileHandler(log_dir() / "ridgefill.log", maxBytes=2_000_000, backupCount=3, encoding="utf-8")
        fh.setFormatter(fmt)
        fh.setLevel(logging.DEBUG)
        root.addHandler(fh)
    except OSError:
        pass
    if sys.stderr is not None:
        sh = logging.StreamHandler(sys.stderr)
        sh.setFormatter(fmt)
        sh.setLevel(logging.DEBUG if verbose else logging.WARNING)
        root.addHandler(sh)
    root._ridgefill_ready = True  # type: ignore[attr-defined]
