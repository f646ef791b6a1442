"""`python -m app run`: the GUI where there is a display, else the headless demo."""
from __future__ import annotations

import os
import sys


def register(sub) -> None:
    p = sub.add_parser("run", help="open the GUI where there is a display, else run the headless demo")
    p.add_argument("--tokens", type=int, default=None, help="when headless: cut the demo document to about this many tokens")
    p.set_defaults(func=run)


def has_display() -> bool:
    if sys.platform in ("win32", "darwin"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def run(args) -> int:
    if has_display() and os.environ.get("QT_QPA_PLATFORM") != "offscreen":
        return open_gui(args)
    print("No display found: running the headless demo instead of the GUI.\n")
    from app.commands import demo

    return demo.run(args)


def open_gui(args) -> int:
    from app.gui import main as gui_main

    return gui_main(args)
