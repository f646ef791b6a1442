"""Files and folders under the user folders, readable by their owner only whatever the umask: a cache entry
holds a document's tokens, a map or a log may name it, a chat holds it whole (folders 0700, files 0600)."""
from __future__ import annotations

import os
import stat
from pathlib import Path

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def private_dir(path: str | Path) -> Path:
    """`path` and each missing folder above it, created 0700 (folders that exist are left as they are)."""
    path = Path(path)
    missing = []
    q = path
    while not q.exists() and q != q.parent:
        missing.append(q)
        q = q.parent
    for q in reversed(missing):
        q.mkdir(mode=PRIVATE_DIR, exist_ok=True)  # a umask only clears bits: 0700 stays 0700
    return path


def private_opener(path: str, flags: int) -> int:
    """open(..., opener=private_opener): a file it creates is 0600."""
    return os.open(path, flags, PRIVATE_FILE)


def open_private(path: str | Path, mode: str = "wb", **kw):
    """open() whose new file is 0600 (an existing one keeps its mode)."""
    return open(path, mode, opener=private_opener, **kw)


def write_text_private(path: str | Path, text: str) -> None:
    with open_private(path, "w", encoding="utf-8") as f:
        f.write(text)


def make_private(path: str | Path) -> None:
    """A file another library wrote (safetensors): 0600 from now on."""
    os.chmod(path, PRIVATE_FILE)


def tighten(*paths: str | Path) -> list[Path]:
    """Folders and files an earlier version (or a umask of 022) left readable by others made private: a folder
    0700, a file 0600. Links are not followed and what another user owns is left alone; the paths changed."""
    changed: list[Path] = []
    if os.name != "posix":  # Windows keeps access in ACLs: a user's profile folder is private already
        return changed
    for path in map(Path, paths):
        try:
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode) or st.st_uid != os.getuid() or not st.st_mode & 0o077:
                continue
            os.chmod(path, PRIVATE_DIR if stat.S_ISDIR(st.st_mode) else PRIVATE_FILE)
            changed.append(path)
        except OSError:  # gone meanwhile, or a file system without modes: nothing to narrow
            continue
    return changed
