"""The lock every config file (settings.json, servers.json, the user's model list) is read, changed and written
under, so two processes (two windows, a window and `python -m app models --add`) never lose each other's writes.

A `filelock.FileLock` on NAME.lock beside the file (the name settings.json.lock had before, so an older window
still takes the same lock); one lock a file rather than one for all, since the model list lives in another folder.
One object per lock file in this process (filelock's singletons): nested use in one thread re-enters it rather
than waiting on itself, and another thread waits as another process does.
"""
from __future__ import annotations

from pathlib import Path

from filelock import FileLock

from .private_files import PRIVATE_FILE, private_dir

LOCK_TIMEOUT_S = 10  # another process's write takes milliseconds; past this the write fails as a disk error would


def lock_path(path: str | Path) -> Path:
    path = Path(path)
    return path.with_name(path.name + ".lock")


def config_lock(path: str | Path) -> FileLock:
    """The lock for config file `path` (its folder made, 0700); `with config_lock(p):` around read-modify-write.
    Raises filelock.Timeout (an OSError) when another process holds it past LOCK_TIMEOUT_S."""
    private_dir(Path(path).parent)
    return FileLock(lock_path(path), mode=PRIVATE_FILE, timeout=LOCK_TIMEOUT_S, is_singleton=True)
