"""The prompt cache on disk: sequence 0's state after a prefill, so a document is prefilled once.

One entry per model and token prefix, a folder `<model key>-<prefix hash>/` under the user cache's
prompts/ (backend/user_paths.py) holding
  entry.json           the header: format, model key and name, llama.cpp build, token count, exact rows,
                       the state's and streams' sizes and sha256, the row record (tokens, approximated runs)
  state.bin            llama.cpp's bytes of sequence 0 (backend/seq_state.py)
  streams.safetensors  the kept split streams of rows a RidgeFill bulk pass computed, where there are any
Only JSON and safetensors are read besides the state (no pickle). An entry is written under a hidden name
and renamed whole (a crash or a full disk leaves no half-written entry); entry.json's mtime is its last use;
a size limit evicts the least recently used. A bad entry (damaged, malformed, another model's or build's)
is refused with the reason and removed; one that cannot be read this time for a reason outside it (too
many open files, a permission, an I/O error) is refused and kept. Entry shapes: backend/cache_entry_shape.py.

Processes share the folder (the GUI's engine and `serve`, two `chat`s): renames to and from entry names
happen under one file lock (filelock, `.<root>.lock` beside the folder), a reader reads an entry's files
through one open folder (all from one entry), and an entry is removed only while its folder still holds
the header that was refused (or none that reads): never another process's fresh entry.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import stat
import struct
import time
import uuid
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
from filelock import FileLock
from safetensors import SafetensorError

from .cache_entry_shape import FORMAT, arrays_problem, header_problem, record_problem
from .entry_folder import EntryFolder, NotPlainFile, TooLarge, not_its_fault, opened
from .private_files import PRIVATE_DIR, PRIVATE_FILE, open_private, private_dir, write_text_private
from .seq_state import MARK_BYTES, StateFormatError, StateLayout, read_layout
from .user_paths import prompts_dir

log = logging.getLogger(__name__)

DEFAULT_LIMIT_BYTES = 4 * 10**9  # a setting (app/settings.py); 4 GB holds ~25 SmolLM2 documents of 6,000 tokens
HEADER, STATE, STREAMS = "entry.json", "state.bin", "streams.safetensors"
WRITE_CHUNK = 16 << 20  # the state is written in pieces, so a save can stop between them
STALE_S = 3600.0  # a hidden folder this old is a writer that died: removed
MAX_HEADER_BYTES = 64 << 20  # a 128k-token record is ~1 MB of JSON: anything far larger is not a header
LOCK_TIMEOUT_S = 60.0  # renames take milliseconds: a lock held this long is a hung process (OSError)

# What reading a damaged or hostile entry can raise, besides EntryRefused (RecursionError: nested JSON)
READ_ERRORS = (OSError, ValueError, KeyError, TypeError, IndexError, OverflowError, RecursionError, SafetensorError)


class EntryRefused(Exception):
    """A saved entry that cannot be used; the message says why (it has been removed, unless EntryKept)."""


class EntryKept(EntryRefused):
    """An entry not read this time for a reason outside it (entry_folder.not_its_fault): it is kept."""


@dataclass(frozen=True)
class Build:
    """What a state was written by: a state from another llama.cpp build is refused."""
    llama_cpp: str
    state_mark: str  # hex of the state's leading bytes (seq_state.MARK_BYTES)


@dataclass
class Entry:
    folder: Path
    header: dict  # checked by header_problem: every field has its type and the record its shape
    last_used: float
    n_bytes: int

    def as_dict(self) -> dict:
        """The entry as `cache list --json` prints it."""
        try:
            files = [str(p) for p in sorted(self.folder.iterdir())]
        except OSError:  # removed by another process since it was listed
            files = []
        return {"files": files, "model": self.header.get("model_name"),
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

    def entries(self, model_key: str | None = None) -> list[Entry]:
        """Every entry (of `model_key`'s, where given) whose header reads and has its shape, newest use first."""
        return self._scan(model_key)[0]

    def _scan(self, model_key: str | None = None) -> tuple[list[Entry], list[tuple[Path, int]]]:
        """The entries, and the other (unreadable) entry folders with their sizes."""
        out, bad = [], []
        for folder in self._folders():
            if model_key is not None and not folder.name.startswith(f"{model_key}-"):
                continue
            try:
                with opened(folder) as files:
                    header, last_used = _header_at(files), files.stat(HEADER).st_mtime
                    ok = not header_problem(header) and stat.S_ISREG(files.stat(STATE).st_mode)
            except (EntryRefused, *READ_ERRORS) as exc:
                if not_its_fault(exc):
                    continue  # neither listed nor evicted as damaged: tried again next time
                ok = False
            if ok:
                out.append(Entry(folder, header, last_used, _size(folder)))
            elif folder.is_dir():  # not being removed right now: unreadable
                bad.append((folder, _size(folder)))
        return sorted(out, key=lambda e: -e.last_used), bad

    def total_bytes(self) -> int:
        return sum(e.n_bytes for e in self.entries())

    def load(self, entry: Entry, *, model_key: str, build: Build) -> Loaded:
        """The entry's state, checked whole; EntryRefused (the entry removed) if it is bad or gone."""
        try:
            with opened(entry.folder) as files:
                return self._read(files, entry, model_key, build)
        except (EntryRefused, *READ_ERRORS) as exc:
            if not_its_fault(exc):
                raise EntryKept(f"the saved prompt could not be read this time ({exc}); it is kept") from None
            self.remove(entry)
            if isinstance(exc, EntryRefused):
                raise
            if isinstance(exc, FileNotFoundError):
                raise EntryRefused(f"the saved prompt is incomplete or gone ({exc.filename or exc})") from None
            raise EntryRefused(f"the saved prompt could not be read ({type(exc).__name__}: {str(exc)[:200]})") from None

    def _read(self, files: EntryFolder, entry: Entry, model_key: str, build: Build) -> Loaded:
        h = _header_at(files)
        if why := header_problem(h):
            raise EntryRefused(f"the saved prompt's header is malformed ({why})")
        if not _same(h, entry.header):
            raise EntryRefused("the saved prompt changed while it was read (another process replaced it)")
        if h["model_key"] != model_key:
            raise EntryRefused(f"the saved prompt is for another model ({h['model_name']}, key {h['model_key']})")
        if h["build"] != {"llama_cpp": build.llama_cpp, "state_mark": build.state_mark}:
            raise EntryRefused(f"the saved prompt was written by another llama.cpp build ({h['build']})")
        state = _read_file(files, STATE, h["state_bytes"])
        if len(state) != h["state_bytes"] or hashlib.sha256(state).hexdigest() != h["state_sha256"]:
            raise EntryRefused(f"the saved state is damaged ({len(state):,} bytes, sha256 differs from its header)")
        n = len(h["record"]["tokens"])
        if len(state) >= MARK_BYTES + 8 and struct.unpack_from("<I", state, MARK_BYTES + 4)[0] != n:
            # read_layout sizes an array by the state's cell count before it checks the bytes are there
            raise EntryRefused(f"the row record ({n:,} rows) disagrees with the state's cell count")
        try:
            layout = read_layout(state)
        except StateFormatError as exc:
            raise EntryRefused(f"the saved state is not one this build reads ({exc})") from None
        if layout.mark.hex() != build.state_mark:
            raise EntryRefused("the saved state was written by another llama.cpp build (its mark differs)")
        if layout.n_rows != n or h["n_tokens"] != n:
            raise EntryRefused(f"the row record ({n:,} rows) disagrees with the state ({layout.n_rows:,} rows)")
        exact = n - sum(end - start for start, end, _ in h["record"]["approximated"])
        if (h["exact_rows"], h["clean_rows"]) != (exact, h["record"]["n_clean"]):
            raise EntryRefused("the header's counts of exact and clean rows disagree with its row record")
        arrays = self._read_streams(files, h)
        with suppress(OSError):  # evicted since: what was read is whole and checked
            files.touch(HEADER)  # its last use
        return Loaded(entry, state, layout, arrays)

    def _read_streams(self, files: EntryFolder, h: dict) -> dict[str, np.ndarray]:
        """The kept split streams, checked against the header (where it has their sha256) and the record."""
        from safetensors.numpy import load

        try:
            blob = _read_file(files, STREAMS, h.get("streams_bytes", self.limit_bytes))
        except FileNotFoundError:
            if "streams_sha256" in h:
                raise  # removed while read: "incomplete or gone"
            return {}  # an entry without split streams
        if "streams_sha256" in h and hashlib.sha256(blob).hexdigest() != h["streams_sha256"]:
            raise EntryRefused("the saved split streams are damaged (sha256 differs from the header)")
        try:
            arrays = load(bytes(blob))
        except SafetensorError as exc:
            raise EntryRefused(f"the saved split streams are damaged ({str(exc)[:200]})") from None
        if why := arrays_problem(arrays, h["record"]):
            raise EntryRefused(why)
        return arrays

    def save(self, *, model_key: str, model_name: str, build: Build, state: bytearray, facts: dict,
             arrays: dict[str, np.ndarray], cancel: Callable[[], bool] | None = None) -> Entry | None:
        """Write an entry for `facts["tokens"]` (replacing one for the same tokens), then evict down to
        the limit. None when `cancel` said stop between pieces or the entry alone exceeds the limit;
        OSError when anything fails writing (a full disk, the folder locked too long): nothing is left
        behind; ValueError for a malformed record (nothing is written)."""
        if why := record_problem(facts) or arrays_problem(arrays, facts):
            raise ValueError(f"the row record cannot be saved: {why}")
        size = len(state) + sum(a.nbytes for a in arrays.values())
        if size > self.limit_bytes:
            log.info("prompt cache: an entry of %s bytes exceeds the limit of %s", size, self.limit_bytes)
            return None
        name = entry_name(model_key, facts["tokens"])
        private_dir(self.root)
        self._remove_stale()
        tmp = self.root / f".{name}.{uuid.uuid4().hex[:8]}"
        try:
            tmp.mkdir(mode=PRIVATE_DIR)
            header = self._write(tmp, model_key, model_name, build, state, facts, arrays, cancel)
            if header is None:
                return None
            final = self.root / name
            with self._lock():
                old = self._replace(tmp, final)
                entry = Entry(final, header, (final / HEADER).stat().st_mtime, size)
            _rmtree([old])
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        self.evict(keep=final)
        return entry

    def _write(self, tmp: Path, model_key: str, model_name: str, build: Build, state: bytearray, facts: dict,
               arrays: dict[str, np.ndarray], cancel: Callable[[], bool] | None) -> dict | None:
        """The entry's files in `tmp`; its header as a reader parses it (None: `cancel` said stop)."""
        if (sha := _write_state(tmp / STATE, state, cancel)) is None:
            return None
        n, approximated = len(facts["tokens"]), sum(end - start for start, end, _ in facts["approximated"])
        header = {"format": FORMAT, "model_key": model_key, "model_name": model_name,
                  "build": {"llama_cpp": build.llama_cpp, "state_mark": build.state_mark},
                  "n_tokens": n, "exact_rows": n - approximated, "clean_rows": int(facts["n_clean"]),
                  "state_bytes": len(state), "state_sha256": sha, "record": facts, "saved": time.time()}
        if arrays:
            from safetensors.numpy import save

            blob = save(arrays)  # written as any file: a full disk is an OSError (save_file raises SafetensorError)
            if (streams_sha := _write_state(tmp / STREAMS, blob, cancel)) is None:
                return None
            header.update(streams_bytes=len(blob), streams_sha256=streams_sha)
        text = json.dumps(header, ensure_ascii=True)  # a model name's lone surrogate as \udxxx: it reads back the same
        write_text_private(tmp / HEADER, text)
        return json.loads(text)  # tuples as lists: the header a reader compares with (remove by identity)

    def _replace(self, tmp: Path, final: Path) -> Path | None:
        """`tmp` renamed to `final` (the lock held); an entry there before is moved aside first: its
        hidden path, to be removed once the lock is released."""
        old = None
        if final.exists():
            old = final.with_name(f".{final.name}.old.{uuid.uuid4().hex[:8]}")
            os.rename(final, old)
        os.rename(tmp, final)
        return old

    def remove(self, entry: Entry) -> bool:
        """Take the entry away if its folder still holds it (the same header, or one that does not read):
        another process's newer entry at the same path stays. Whether it was taken."""
        try:
            with self._lock():
                gone = self._take(entry.folder, entry.header)
        except OSError as exc:  # the folder locked too long: it is refused again next time
            log.warning("prompt cache: could not remove %s: %s", entry.folder.name, exc)
            return False
        _rmtree([gone])
        return gone is not None

    def _take(self, folder: Path, header: dict | None) -> Path | None:
        """`folder` renamed hidden (the lock held), if it holds `header` or an unreadable one; the hidden path."""
        try:
            with opened(folder) as files:
                here = _header_at(files)
        except (EntryRefused, *READ_ERRORS) as exc:
            if not_its_fault(exc):
                return None  # unreadable this time, not damaged: it stays
            here = None  # damaged (or gone: the rename below fails)
        if here is not None and not header_problem(here) and not _same(here, header):
            return None  # another process's entry now
        gone = folder.with_name(f".{folder.name}.gone.{uuid.uuid4().hex[:8]}")
        try:
            os.rename(folder, gone)
        except OSError:
            return None  # gone already
        return gone

    def clear(self) -> int:
        """Remove every entry, and unreadable entry folders; returns how many entries there were. Another
        process's entry being written (hidden, younger than STALE_S) stays."""
        gone = []
        with self._lock():
            entries, bad = self._scan()
            gone += [self._take(e.folder, e.header) for e in entries]
            gone += [self._take(folder, None) for folder, _ in bad]
        _rmtree(gone)
        self._remove_stale()
        return len(entries)

    def evict(self, keep: Path | None = None) -> list[Entry]:
        """Remove unreadable entry folders, then the least recently used entries (never `keep`), until
        the rest fit the limit."""
        gone, taken = [], []
        with self._lock():
            entries, bad = self._scan()  # another version's or damaged folders count, and go first
            queue = [(f, None, n, None) for f, n in bad] + \
                [(e.folder, e.header, e.n_bytes, e) for e in sorted(entries, key=lambda e: e.last_used)]
            total = sum(n for _, _, n, _ in queue)
            for folder, header, n_bytes, e in queue:
                if total <= self.limit_bytes:
                    break
                if folder != keep and (p := self._take(folder, header)) is not None:
                    total -= n_bytes
                    taken.append(p)
                    gone += [e] if e is not None else []
        _rmtree(taken)
        return gone

    @contextmanager
    def _lock(self) -> Iterator[None]:
        """The cache-wide lock across processes, a file beside the folder (inside, it would be listed)."""
        private_dir(self.root.parent)
        with FileLock(str(self.root.with_name(f".{self.root.name}.lock")), mode=PRIVATE_FILE, timeout=LOCK_TIMEOUT_S):
            yield

    def _folders(self, hidden: bool = False) -> list[Path]:
        if not self.root.is_dir():
            return []
        return [p for p in self.root.iterdir() if p.is_dir() and (hidden or not p.name.startswith("."))]

    def _remove_stale(self) -> None:
        """Hidden folders older than STALE_S: writers that died, leftovers of removals."""
        for p in self._folders(hidden=True):
            with suppress(OSError):  # removed by its owner meanwhile
                if p.name.startswith(".") and time.time() - p.stat().st_mtime > STALE_S:
                    shutil.rmtree(p, ignore_errors=True)


def _size(folder: Path) -> int:
    with suppress(OSError):  # removed meanwhile: 0
        return sum(p.stat().st_size for p in folder.iterdir())
    return 0


def _same(a, b) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)  # NaN equals NaN, as on disk


def _rmtree(paths: list[Path | None]) -> None:
    for p in filter(None, paths):
        shutil.rmtree(p, ignore_errors=True)


def _header_at(files: EntryFolder):
    return json.loads(_read_file(files, HEADER, MAX_HEADER_BYTES))


def _read_file(files: EntryFolder, name: str, limit: int) -> bytearray:
    """The bytes of `name` in the open folder; EntryRefused when it is larger than `limit` (not read), or
    not a plain file (a link, a FIFO: never followed, never waited on)."""
    try:
        return files.read(name, limit)
    except NotPlainFile:
        raise EntryRefused(f"the saved {name} is not a plain file") from None
    except TooLarge as exc:
        raise EntryRefused(f"the saved {name} is damaged ({exc} bytes, more than the {limit:,} expected)") from None


def _write_state(path: Path, data, cancel: Callable[[], bool] | None) -> str | None:
    """Write `data` piece by piece; its sha256, or None when `cancel` said stop between pieces."""
    sha = hashlib.sha256()
    view = memoryview(data)
    with open_private(path, "wb") as f:
        for at in range(0, len(view), WRITE_CHUNK):
            if cancel is not None and cancel():
                return None
            piece = view[at : at + WRITE_CHUNK]
            f.write(piece)
            sha.update(piece)
    return sha.hexdigest()
