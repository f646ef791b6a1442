"""What is installed in the user cache, and the atomic steps that put things there.

A model is installed when models/<id>/installed.json exists and its file has the recorded size; the
record is written (atomically) only after the file was verified and moved into place, so a crash at
any point leaves either nothing or a verified model, never a half-written one taken for ready.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from backend.embedded_models import embedded_file
from backend.errors import ModelFileError

from .catalogue import ModelEntry
from .settings import HubSettings

RECORD = "installed.json"


def model_path(entry: ModelEntry, settings: HubSettings) -> Path | None:
    """The verified file of an entry, or None when it is not installed. An embedded entry is installed with
    the app; Gemma's file is assembled from its package when first opened (model_file.check_gguf)."""
    if entry.embedded:  # ships with the app (Gemma's file is assembled when first opened)
        try:
            return embedded_file(entry.filename)
        except ModelFileError:  # its package is not here (the bundle): a download, as any hub model
            pass
    if entry.local_path:
        p = Path(entry.local_path)
        return p if p.is_file() else None
    folder = settings.models_dir / entry.id
    rec = read_record(folder)
    if rec is None:
        return None
    p = folder / rec["filename"]
    return p if p.is_file() and p.stat().st_size == rec["size_bytes"] else None


def read_record(folder: Path) -> dict | None:
    """The installed file's record, or None when it is missing, damaged or not of its shape (a file name
    in `folder`, a size in bytes)."""
    try:
        rec = json.loads((folder / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # RecursionError: JSON nested too deep
        return None
    name = rec.get("filename") if isinstance(rec, dict) else None
    ok = isinstance(name, str) and name not in ("", ".", "..") and Path(name).name == name \
        and type(rec.get("size_bytes")) is int
    return rec if ok else None


def write_json_atomic(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def install_model(staged: Path, entry: ModelEntry, settings: HubSettings, facts: dict) -> Path:
    """Move a verified file into models/<id>/ and then write its record (same volume: os.replace)."""
    folder = settings.models_dir / entry.id
    folder.mkdir(parents=True, exist_ok=True)
    (folder / RECORD).unlink(missing_ok=True)  # an older install stops counting before it is replaced
    final = folder / Path(entry.filename).name  # a file in a repo subfolder lands flat
    os.replace(staged, final)
    write_json_atomic(folder / RECORD, {**facts, "filename": final.name, "size_bytes": final.stat().st_size,
                                        "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    return final


def install_folder(staged: Path, final: Path) -> Path:
    """Swap a verified map folder into place; an older one at `final` is removed only afterwards."""
    final.parent.mkdir(parents=True, exist_ok=True)
    old = None
    if final.exists():
        old = final.with_name(final.name + f".old-{os.getpid()}")
        os.replace(final, old)
    os.replace(staged, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final


def remove_quietly(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
