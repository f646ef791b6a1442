"""One prompt-cache entry's folder, held open while its files are read, so that they all come from that
one entry even if another process renames or removes it meanwhile (backend/prompt_cache.py).

Where the OS reads files relative to an open folder (Linux, macOS: `dir_fd`), that is how; elsewhere
(Windows, where a folder with an open file cannot be renamed anyway) files are read by path. Either way
a file is never followed through a link, never waited on (a FIFO), and never read past a size limit."""
from __future__ import annotations

import errno
import os
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

# Relative reads need all three; Windows has none of them.
BY_DIR_FD = all(hasattr(os, name) for name in ("O_DIRECTORY", "O_NOFOLLOW", "O_NONBLOCK")) \
    and os.open in os.supports_dir_fd and os.stat in os.supports_dir_fd and os.utime in os.supports_dir_fd


# OSErrors that say nothing about an entry's bytes: too many open files, a permission, an I/O error
NOT_ITS_FAULT = frozenset({errno.EACCES, errno.EPERM, errno.EMFILE, errno.ENFILE, errno.EIO, errno.ENOMEM,
                           errno.EAGAIN, errno.EINTR, errno.EBUSY})


def not_its_fault(exc: BaseException) -> bool:
    """Whether a read failed for a reason outside the entry: it is kept, not removed as damaged."""
    return isinstance(exc, OSError) and exc.errno in NOT_ITS_FAULT


class NotPlainFile(ValueError):
    """The file is a link, a FIFO or another non-regular file."""


class TooLarge(ValueError):
    """The file is larger than the limit it was read with (its size is the message's)."""


class EntryFolder:
    def __init__(self, folder: Path, fd: int | None):
        self.folder, self._fd = folder, fd

    def stat(self, name: str) -> os.stat_result:
        if self._fd is not None:
            return os.stat(name, dir_fd=self._fd, follow_symlinks=False)
        return os.stat(self.folder / name, follow_symlinks=False)

    def touch(self, name: str) -> None:
        """Its last use: now."""
        if self._fd is not None:
            os.utime(name, dir_fd=self._fd)
        else:
            os.utime(self.folder / name)

    def read(self, name: str, limit: int) -> bytearray:
        """The bytes of `name`; NotPlainFile or TooLarge (nothing read) where it is not a plain file of at
        most `limit` bytes."""
        if self._fd is not None:
            handle = open(os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=self._fd), "rb")
        else:
            if not stat.S_ISREG(self.stat(name).st_mode):
                raise NotPlainFile(name)
            handle = open(self.folder / name, "rb")
        with handle as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise NotPlainFile(name)
            if st.st_size > limit:
                raise TooLarge(f"{st.st_size:,}")
            data = bytearray(st.st_size)
            got = f.readinto(data)
            return data if got == st.st_size else data[:got]


@contextmanager
def opened(folder: Path) -> Iterator[EntryFolder]:
    """`folder` held open (where the OS allows) while the block reads it."""
    if not BY_DIR_FD:
        yield EntryFolder(Path(folder), None)
        return
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        yield EntryFolder(Path(folder), fd)
    finally:
        os.close(fd)
