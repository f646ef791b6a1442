"""Free disk space where something is about to be written (the folder may not exist yet)."""
from __future__ import annotations

import shutil
from pathlib import Path

DISK_MARGIN = 64 * 1024 * 1024  # room left so the OS, manifests and a file being renamed never hit zero


def free_bytes(path: Path | str) -> int:
    """Free bytes on the disk that holds `path`, or its nearest existing parent."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free
