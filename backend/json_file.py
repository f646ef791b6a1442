"""A small JSON file a person may read and edit (settings, a conversation, the user's models): read as one
JSON object, or set aside whole and reported; written whole, atomically and readable by its owner only.

Setting aside (renaming to NAME.bad-<time>) rather than deleting or overwriting: the next save would
otherwise replace what the user wrote by hand, and the file may hold their only copy of a conversation.
"""
from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import time
from collections import deque
from pathlib import Path

from .private_files import private_dir, private_opener

log = logging.getLogger(__name__)
_NOTICES: deque[str] = deque(maxlen=20)  # a long fuzz run sets aside thousands: the last few are shown


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
    which is renamed to NAME.bad-<time> (nothing lost) with a notice saying where it went."""
    return read_object_and_bytes(path, what)[0]


def read_object_and_bytes(path: Path, what: str) -> tuple[dict | None, bytes | None]:
    """read_object's answer and the bytes it was read from (None where there were none), for repair()."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, None
    except OSError as exc:  # permissions, a folder in its place: left as it is for the user to fix
        log.warning("%s %s could not be read (%s); using defaults", what, path, exc)
        return None, None
    try:
        return parse_object(raw.decode("utf-8-sig"), what), raw  # -sig: Notepad's byte-order mark
    except (NotAnObject, UnicodeDecodeError) as exc:
        kept = set_aside(path)
        tell(f"{exc}; it was kept as {kept or path} and defaults are used. Fix or delete that file.")
        return None, None


def repair(path: Path, raw: bytes, text: str, what: str, wrong: str) -> Path | None:
    """`path` rewritten as `text` (what was right in it) once its bytes `raw` are kept as NAME.bad-<time>, and
    the user told; the copy's path. Nothing is rewritten when the copy cannot be made (None)."""
    path = Path(path)
    kept = None
    for target in _free_names(path):
        try:
            with open(target, "xb", opener=private_opener) as f:  # "x": never over another's copy
                f.write(raw)
            kept = target
            break
        except FileExistsError:
            continue
        except OSError as exc:
            log.warning("%s %s has %s, but no copy could be kept (%s); it is left as it is", what, path, wrong, exc)
            return None
    if kept is None:
        return None
    write_private(path, text)
    tell(f"{what} {path} had {wrong}: defaults are used for them, and the file as it was is kept as {kept}.")
    return kept


def set_aside(path: Path) -> Path | None:
    """Rename `path` to a free NAME.bad-<time>[-n] beside it; the new path (None when it could not be renamed)."""
    for target in _free_names(path):
        if target.exists():
            continue
        try:
            os.rename(path, target)  # another process may set it aside first: then nothing is left to move
            return target
        except OSError:
            return None
    return None


def _free_names(path: Path):
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(100):
        yield path.with_name(f"{path.name}.bad-{stamp}" + (f"-{n}" if n else ""))


def tell(message: str) -> None:
    """Log a warning the user must see, and keep it for the window to show (notices()); one already kept is
    not kept twice (a list read on each refresh says the same each time)."""
    message = message[:1].upper() + message[1:]
    log.warning("%s", message)
    if message not in _NOTICES:
        _NOTICES.append(message)


def notices(clear: bool = False) -> list[str]:
    """The files set aside or repaired by this process, newest last (the window shows them: a log line is
    seen by nobody); `clear`: as shown, forget them."""
    out = list(_NOTICES)
    if clear:
        _NOTICES.clear()
    return out


def finite(value):
    """`value` with every float JSON cannot hold (infinity, NaN) as None: Python writes them as Infinity and
    NaN, which no strict reader takes (a ratio to a yardstick of 0 is infinite)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


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
