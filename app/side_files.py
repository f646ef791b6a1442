"""The side files of the chats' documents (documents/<key>.txt beside the chat files): each written once, and
removed once no chat file names it any more (a document removed from its chat, a chat deleted).

Only the conversation store's writer thread calls these (app/conversations.py). Removal runs under the chat
folder's lock, which every process's store holds while it writes a chat file, and a store writes its side
files again under that lock when one went missing since: so a file another process's chat names is never
left missing, however the two interleave.
"""
from __future__ import annotations

import logging
import os
import re
import uuid
from pathlib import Path
from typing import Iterable

from backend.private_files import open_private, private_dir

log = logging.getLogger(__name__)

TEXT_FILE = re.compile(r"[0-9a-f]{32}\.txt")  # a side file's name: inside documents/, never a path
TEXT_CHUNK = 1 << 20  # a side file is encoded this many characters at a time: the GIL is let go between
# how a chat file names a side file; read from the raw bytes, so a damaged or set-aside chat keeps its own too
_NAMED = re.compile(rb'"text_file"\s*:\s*"([0-9a-f]{32}\.txt)"')


def write_once(path: Path, text: str) -> None:
    """The side file of a document's text, written whole (temp + rename) unless it is there: it never changes."""
    if path.exists():
        return
    private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open_private(tmp, "wb") as f:
            for i in range(0, len(text), TEXT_CHUNK):  # lone surrogates (a document's bytes) round-trip
                f.write(text[i:i + TEXT_CHUNK].encode("utf-8", "surrogatepass"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def named_in(chat_file: Path) -> set[str]:
    """The side files `chat_file` names (none when it is not there); OSError when it cannot be read."""
    try:
        raw = chat_file.read_bytes()
    except FileNotFoundError:
        return set()
    return {m.decode("ascii") for m in _NAMED.findall(raw)}


def remove_unnamed(chats: Path, documents: Path, candidates: Iterable[str] | None = None) -> list[str]:
    """Remove those of `candidates` (None: every side file in `documents`) that no file of `chats` names: chat
    files, set-aside ones and a crashed write's temp files alike. The caller holds the chat folder's lock. When
    a chat file cannot be read, nothing is removed. Returns the names removed."""
    if candidates is None:
        candidates = [p.name for p in documents.glob("*.txt")] if documents.is_dir() else []
    unnamed = {c for c in candidates if TEXT_FILE.fullmatch(c)}
    if not unnamed:
        return []
    try:
        for p in chats.iterdir():
            if ".json" in p.name and p.is_file():
                unnamed -= named_in(p)
    except OSError as exc:  # a chat not read may name any of them
        log.warning("document files not cleaned up: %s", exc)
        return []
    for name in sorted(unnamed):
        (documents / name).unlink(missing_ok=True)
    return sorted(unnamed)
