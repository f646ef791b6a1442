"""Runtime hook of the bundled app: runs before the entry script.

- The embedded model ships inside the bundle (models/); backend/model_file.py honours
  RIDGEFILL_EMBEDDED_MODEL, so point it there (a user's own setting wins).
- A windowed build (Windows, macOS app) starts with sys.stdout/sys.stderr set to None; any
  print() or library writing to them would raise. Point them at a file in the user log dir (or at
  os.devnull when that cannot be opened), so nothing ever writes to a missing stream.
"""
import os
import sys


def _bundle_dir() -> str:
    return getattr(sys, "_MEIPASS", os.path.dirname(os.path.abspath(sys.executable)))


def _embedded_model() -> None:
    if os.environ.get("RIDGEFILL_EMBEDDED_MODEL"):
        return
    folder = os.path.join(_bundle_dir(), "models")
    if os.path.isdir(folder):
        ggufs = sorted(n for n in os.listdir(folder) if n.endswith(".gguf"))
        if ggufs:
            os.environ["RIDGEFILL_EMBEDDED_MODEL"] = os.path.join(folder, ggufs[0])


def _missing_streams() -> None:
    if sys.stdout is not None and sys.stderr is not None:
        return
    stream = None
    try:
        from backend.user_paths import log_dir

        stream = open(os.path.join(str(log_dir()), "console.log"), "a", encoding="utf-8", buffering=1)
    except Exception:
        stream = open(os.devnull, "w", encoding="utf-8")
    if sys.stdout is None:
        sys.stdout = stream
    if sys.stderr is None:
        sys.stderr = stream


_embedded_model()
_missing_streams()
