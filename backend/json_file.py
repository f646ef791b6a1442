"""A small JSON file a person may read and edit (settings, a conversation, the user's models): read as one
JSON object, or set aside whole and reported; written whole, atomically and readable by its owner only.

Setting aside (renaming to NAME.bad-<time>) rather than deleting or overwriting: the next save would
otherwise replace what the user wrote by hand, and the file may hold their only copy of a conversation.
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from pathlib import Path

from .private_files import private_dir

log = logging.getLogger(__name__)


class NotAnObject(ValueError):
    """A JSON file that is unreadable, not JSON, or not a JSON object (the reason is the message)."""


def parse_object(text: str, what: str) -> dict:
    """The JSON object in `text`; NotAnObject says what is wrong with it (nesting too deep included)."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # json recurses on nested brackets
        raise NotAnObject(f"{what} is not valid JSON ({type(exc).__name__}: {str(exc)[:120]})") from None
    if not isinstance(data, dict):
        raise NotAnObject(f"{what} holds a JSON {type(data).__name__}, not an object")
    return data


def read_object(path: Path, what: str) -> dict | None:
    """The JSON object in `path`, or None: no file, a file that cannot be opened, or one of the wrong shape,
    which is renamed to NAME.bad-<time> (nothing lost) with a warning saying where it went."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:  # permissions, a folder in its place: left as it is for the user to fix
        log.warning("%s %s could not be read (%s); using defaults", what, path, exc)
        return None
    try:
        return parse_object(raw.decode("utf-8"), what)
    except (NotAnObject, UnicodeDecodeError) as exc:
        kept = set_aside(path)
        log.warning("%s; it was kept as %s and defaults are used. Fix or delete that file.", exc, kept or path)
        return None


def set_aside(path: Path) -> Path | None:
    """Rename `path` to a free NAME.bad-<time>[-n] beside it; the new path (None when it could not be renamed)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(100):
        target = path.with_name(f"{path.name}.bad-{stamp}" + (f"-{n}" if n else ""))
        if target.exists():
            continue
        try:
            os.rename(path, target)  # another process may set it aside first: then nothing is left to move
            return target
        except OSError:
            return None
    return None


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` whole: a unique temporary file in the same folder (two processes never share
    one), flushed, then renamed over `path`. Mode 0600: the file may hold a token or a private chat."""
    path = Path(path)
    private_dir(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)  # created 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
