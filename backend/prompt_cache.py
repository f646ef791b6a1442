"""The prompt cache on disk: sequence 0's state after a prefill, so a document is prefilled once.

One entry per model and token prefix, a folder `<model key>-<prefix hash>/` under the user cache's
prompts/ (backend/user_paths.py) holding
  entry.json           the header: format, model key and name, llama.cpp build, token count, exact rows,
                       the state's size and sha256, and the row record (tokens, approximated runs, clean rows)
  state.bin            llama.cpp's bytes of sequence 0 (backend/seq_state.py)
  streams.safetensors  the kept split streams of rows a RidgeFill bulk pass computed, where there are any
Only JSON and safetensors are read besides the state (no pickle). An entry is written under a hidden
name and renamed whole, so a crash or a full disk leaves no half-written entry; entry.json's mtime is
its last use, and a size limit evicts the least recently used entries. A bad entry (truncated, edited,
another model's or another llama.cpp build's) is refused with the reason and removed.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import numpy as np

from .seq_state import StateFormatError, StateLayout, read_layout
from .user_paths import prompts_dir

log = logging.getLogger(__name__)

FORMAT = 1
DEFAULT_LIMIT_BYTES = 4 * 10**9  # a setting (app/settings.py); 4 GB holds ~25 SmolLM2 documents of 6,000 tokens
HEADER, STATE, STREAMS = "entry.json", "state.bin", "streams.safetensors"
WRITE_CHUNK = 16 << 20  # the state is written in pieces, so a save can stop between them
STALE_S = 3600.0  # a hidden folder this old is a writer that died: removed


class EntryRefused(Exception):
    """A saved entry that cannot be used; the message says why (it has been removed)."""


@dataclass(frozen=True)
class Build:
    """What a state was written by: a state from another llama.cpp build is refused."""
    llama_cpp: str
    state_mark: str  # hex of the state's leading bytes (seq_state.MARK_BYTES)


@dataclass
class Entry:
    folder: Path
    header: dict
    last_used: float
    n_bytes: int

    @property
    def tokens(self) -> list[int]:
        return self.header["record"]["tokens"]

    def as_dict(self) -> dict:
        """The entry as `cache list --json` prints it."""
        return {"files": [str(p) for p in sorted(self.folder.iterdir())], "model": self.header.get("model_name"),
                "tokens": self.header.get("n_tokens"), "exact_rows": self.header.get("exact_rows"),
                "bytes": self.n_bytes,
                "last_used": datetime.fromtimestamp(self.last_used, timezone.utc).isoformat(timespec="seconds")}


@dataclass
class Loaded:
    entry: Entry
    state: bytearray
    layout: StateLayout
    arrays: dict[str, np.ndarray] = field(default_factory=dict)


def entry_name(model_key: str, tokens: list[int]) -> str:
    digest = hashlib.sha256(np.asarray(tokens, dtype="<i4").tobytes()).hexdigest()[:24]
    return f"{model_key}-{digest}"


class PromptCache:
    """The entries under `root` (default: the user cache's prompts/), at most `limit_bytes` in all."""

    def __init__(self, root: Path | None = None, limit_bytes: int = DEFAULT_LIMIT_BYTES):
        self.root = Path(root) if root is not None else prompts_dir()
        self.limit_bytes = int(limit_bytes)

    # ---- reading ---------------------------------------------------------------------------------
    def entries(self, model_key: str | None = None) -> list[Entry]:
        """Every entry (of `model_key`'s folders, where given) whose header reads, newest use first."""
        out = []
        for folder in self._folders():
            if model_key is not None and not folder.name.startswith(f"{model_key}-"):
                continue
            try:
                st = (folder / HEADER).stat()
                header = json.loads((folder / HEADER).read_text(encoding="utf-8"))
                n_bytes = sum(p.stat().st_size for p in folder.iterdir())
                header["record"]["tokens"]
            except (OSError, ValueError, KeyError, TypeError):
                continue  # being removed, or unreadable: load() refuses it if it is ever the best
            out.append(Entry(folder, header, st.st_mtime, n_bytes))
        return sorted(out, key=lambda e: -e.last_used)

    def total_bytes(self) -> int:
        return sum(e.n_bytes for e in self.entries())

    def load(self, entry: Entry, *, model_key: str, build: Build) -> Loaded:
        """The entry's state, checked whole; EntryRefused (the entry removed) when anything disagrees."""
        try:
            loaded = self._read(entry, model_key, build)
        except EntryRefused:
            self.remove(entry)
            raise
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self.remove(entry)
            raise EntryRefused(f"the saved prompt could not be read ({type(exc).__name__}: {exc})") from None
        os.utime(entry.folder / HEADER)  # its last use
        return loaded

    def _read(self, entry: Entry, model_key: str, build: Build) -> Loaded:
        h = json.loads((entry.folder / HEADER).read_text(encoding="utf-8"))
        if h.get("format") != FORMAT:
            raise EntryRefused(f"the saved prompt has format {h.get('format')}, this version reads {FORMAT}")
        if h.get("model_key") != model_key:
            raise EntryRefused(f"the saved prompt is for another model ({h.get('model_name')}, key {h.get('model_key')})")
        if h.get("build") != {"llama_cpp": build.llama_cpp, "state_mark": build.state_mark}:
            raise EntryRefused(f"the saved prompt was written by another llama.cpp build ({h.get('build')})")
        state = bytearray((entry.folder / STATE).read_bytes())
        if len(state) != h["state_bytes"] or hashlib.sha256(state).hexdigest() != h["state_sha256"]:
            raise EntryRefused(f"the saved state is damaged ({len(state):,} bytes, sha256 differs from its header)")
        try:
            layout = read_layout(state)
        except StateFormatError as exc:
            raise EntryRefused(f"the saved state is not one this build reads ({exc})") from None
        if layout.mark.hex() != build.state_mark:
            raise EntryRefused("the saved state was written by another llama.cpp build (its mark differs)")
        n = len(h["record"]["tokens"])
        if layout.n_rows != n or h["n_tokens"] != n:
            raise EntryRefused(f"the row record ({n:,} rows) disagrees with the state ({layout.n_rows:,} rows)")
        arrays = {}
        if (entry.folder / STREAMS).exists():
            from safetensors.numpy import load_file

            arrays = load_file(str(entry.folder / STREAMS))
        return Loaded(entry, state, layout, arrays)

    # ---- writing ---------------------------------------------------------------------------------
    def save(self, *, model_key: str, model_name: str, build: Build, state: bytearray, facts: dict,
             arrays: dict[str, np.ndarray], cancel: Callable[[], bool] | None = None) -> Entry | None:
        """Write an entry for `facts["tokens"]` (replacing one for the same tokens), then evict down to
        the limit. None when `cancel` said stop between pieces or the entry alone exceeds the limit;
        OSError (a full disk) leaves nothing behind."""
        size = len(state) + sum(a.nbytes for a in arrays.values())
        if size > self.limit_bytes:
            log.info("prompt cache: an entry of %s bytes exceeds the limit of %s", size, self.limit_bytes)
            return None
        name = entry_name(model_key, facts["tokens"])
        self.root.mkdir(parents=True, exist_ok=True)
        self._remove_stale()
        tmp = self.root / f".{name}.{uuid.uuid4().hex[:8]}"
        try:
            tmp.mkdir()
            sha = _write_state(tmp / STATE, state, cancel)
            if sha is None:
                return None
            if arrays:
                from safetensors.numpy import save_file

                save_file(arrays, str(tmp / STREAMS))
            n_clean = int(facts["n_clean"])
            approximated = sum(end - start for start, end, _ in facts["approximated"])
            header = {"format": FORMAT, "model_key": model_key, "model_name": model_name,
                      "build": {"llama_cpp": build.llama_cpp, "state_mark": build.state_mark},
                      "n_tokens": len(facts["tokens"]), "exact_rows": len(facts["tokens"]) - approximated,
                      "clean_rows": n_clean, "state_bytes": len(state), "state_sha256": sha, "record": facts,
                      "saved": time.time()}
            (tmp / HEADER).write_text(json.dumps(header), encoding="utf-8")
            final = self._replace(tmp, self.root / name)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        entry = Entry(final, header, (final / HEADER).stat().st_mtime, size)
        self.evict(keep=final)
        return entry

    def _replace(self, tmp: Path, final: Path) -> Path:
        """`tmp` renamed to `final`; an entry there before is moved aside first and removed after."""
        old = None
        if final.exists():
            old = final.with_name(f".{final.name}.old.{uuid.uuid4().hex[:8]}")
            os.rename(final, old)
        os.rename(tmp, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def remove(self, entry: Entry) -> None:
        """Take the entry away (renamed hidden first, so no reader sees half of it)."""
        if not entry.folder.exists():
            return
        gone = entry.folder.with_name(f".{entry.folder.name}.gone.{uuid.uuid4().hex[:8]}")
        try:
            os.rename(entry.folder, gone)
        except OSError:
            return
        shutil.rmtree(gone, ignore_errors=True)

    def clear(self) -> int:
        """Remove every entry; returns how many there were."""
        entries = self.entries()
        for e in entries:
            self.remove(e)
        for folder in self._folders(hidden=True):  # unreadable ones and leftovers
            shutil.rmtree(folder, ignore_errors=True)
        return len(entries)

    def evict(self, keep: Path | None = None) -> list[Entry]:
        """Remove the least recently used entries (never `keep`) until the rest fit the limit."""
        entries = self.entries()
        total = sum(e.n_bytes for e in entries)
        gone = []
        for e in sorted(entries, key=lambda e: e.last_used):
            if total <= self.limit_bytes:
                break
            if keep is not None and e.folder == keep:
                continue
            self.remove(e)
            total -= e.n_bytes
            gone.append(e)
        return gone

    # ---- folders ---------------------------------------------------------------------------------
    def _folders(self, hidden: bool = False) -> list[Path]:
        if not self.root.is_dir():
            return []
        return [p for p in self.root.iterdir() if p.is_dir() and (hidden or not p.name.startswith("."))]

    def _remove_stale(self) -> None:
        now = time.time()
        for p in self._folders(hidden=True):
            try:
                if p.name.startswith(".") and now - p.stat().st_mtime > STALE_S:
                    shutil.rmtree(p, ignore_errors=True)
            except OSError:
                pass


def _write_state(path: Path, state: bytearray, cancel: Callable[[], bool] | None) -> str | None:
    """Write `state` piece by piece; its sha256, or None when `cancel` said stop between pieces."""
    sha = hashlib.sha256()
    view = memoryview(state)
    with open(path, "wb") as f:
        for at in range(0, len(view), WRITE_CHUNK):
            if cancel is not None and cancel():
                return None
            piece = view[at : at + WRITE_CHUNK]
            f.write(piece)
            sha.update(piece)
    return sha.hexdigest()
