"""Logging to a file in the user log dir, and to stderr when there is one (windowed builds have none)."""
from __future__ import annotations

import logging
import sys
from logging.handlers import RotatingFileHandler

from backend.user_paths import log_dir


def setup_logging(verbose: bool = False) -> None:
    root = logging.getLogger()
    if getattr(root, "_ridgefill_ready", False):
        return
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        fh = RotatingFileHandler(log_dir() / "ridgefill.log", maxBytes=2_000_000, backupCount=3, encoding="utf-8")
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
