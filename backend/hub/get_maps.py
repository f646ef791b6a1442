"""Get maps: one call that gives a model a verified map set for a split, however it can be had.

The CLI (`download-maps --fit-if-missing`, `fit-maps`), the GUI's "Get maps" button (an engine task)
and anything else call `get_maps`:
1. a verified set already on disk (the user cache, then the shipped maps_cache/) is used as it is;
2. else, for a catalogue model and unless `download=False`, the published set is downloaded and
   verified (backend/hub/maps_hub.py);
3. else (nothing published, offline, the hub unreachable, or the published set refused) the set is
   fitted here: the calibration activations are captured once per model (resumable, one part per
   sequence, the disk checked first: backend/ridgefill/calibration.py), then the split is fitted from
   them in seconds, written to a hidden staging folder and renamed into place whole
   (backend/ridgefill/map_format.py), and verified exactly like a download (sha256 and fingerprint).
Progress goes to on_progress(stage, done, total) (stages "capture", "fit"); plain sentences (the
capture's size and disk, "resuming", why it fits rather than downloads) go to on_note(text).
Two captures or fits of one model never run at once (a file lock per model, across processes).
"""
from __future__ import annotations

import logging
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from filelock import FileLock, Timeout

from backend.errors import Cancelled, RidgeFillError

from .errors import HubError, MapsNotPublished, NotCachedOffline, VerificationFailed
from .jobs import DownloadJob, State
from .settings import HubSettings

log = logging.getLogger(__name__)

LOCK_POLL_S = 0.5


@dataclass
class CaptureOptions:
    """How calibration activations are captured when a fit needs them (tests use small budgets)."""

    max_tokens: int | None = None  # None: the whole shipped corpus and its chat copies
    seq_tokens: int | None = None  # None: calibration.MAX_SEQ_TOKENS
    stride: int | None = None  # None: calibration.DEFAULT_STRIDE
    recapture: bool = False  # drop a finished capture of this model and capture again
    threads: int | None = None  # CPU threads of the engine opened for the capture (None: all cores)


@dataclass
class GetMapsResult:
    folder: str
    split: int
    how: str  # "cached" | "downloaded" | "fitted"
    status: str  # "verified" | "warning"
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # why it fitted, what the capture did
    capture: dict = field(default_factory=dict)  # the capture's facts (sequences, resumed, seconds, bytes)
    fit_seconds: float | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def entry_for(model_path: Path, settings: HubSettings):
    """The catalogue entry whose installed file is `model_path`, or None (a file not in the catalogue)."""
    from . import store
    from .catalogue import load_catalogue, user_models_file

    target = Path(model_path).resolve()
    for e in load_catalogue(user_models_file()):
        p = store.model_path(e, settings)
        if p is not None and Path(p).resolve() == target:
            return e
    return None


def _lock(settings: HubSettings, model_path: Path, cancel, on_note) -> FileLock:
    from backend.ridgefill.fingerprint import model_fingerprint, variant_key

    lock = FileLock(str(settings.locks_dir / f"fit-{variant_key(model_fingerprint(model_path))}.lock"))
    told = False
    while True:
        try:
            lock.acquire(timeout=LOCK_POLL_S)
            return lock
        except Timeout:
            if cancel is not None and cancel():
                raise Cancelled("Get maps cancelled while another capture or fit of this model was running.")
            if not told and on_note is not None:
                on_note("waiting: another capture or fit of this model is running (here or in another "
                        "RidgeFill process); this one goes on when it ends")
                told = True


def remove_stale_staging(maps_dir: Path, final_name: str) -> list[Path]:
    """Hidden staging folders of `final_name` left by a killed writer (safe under the model's lock)."""
    gone = []
    if Path(maps_dir).is_dir():
        for sub in Path(maps_dir).iterdir():
            if sub.name.startswith(f".{final_name}-") or sub.name == f".{final_name}.old":
                shutil.rmtree(sub, ignore_errors=True)
                gone.append(sub)
    return gone


def get_maps(model_path, split: int, settings: HubSettings | None = None, *, download: bool = True,
             refit: bool = False, out_dir=None, map_dtype: str = "float16",
             capture: CaptureOptions | None = None, engine=None,
             on_progress: Callable[[str, int, int], None] | None = None,
             on_note: Callable[[str], None] | None = None,
             on_download: Callable | None = None,
             cancel: Callable[[], bool] | None = None,
             disk_free: Callable[[Path], int] | None = None) -> GetMapsResult:
    """A verified map set for (model, split): cached, downloaded or fitted (see the module doc).

    `refit` fits even when a set exists (fit-maps); `out_dir` writes the fitted set elsewhere than the
    user cache (then nothing is looked up or downloaded); `engine` captures on an open engine (the GUI's
    engine child) instead of opening one. Raises RidgeFillError subclasses with the reason: a bad split,
    CaptureDiskShort, Cancelled (what was captured stays for the next call; no map folder is half-written).
    """
    from backend.ridgefill.fingerprint import model_fingerprint

    settings = settings or HubSettings()
    model_path = Path(model_path)
    capture = capture or CaptureOptions()
    notes: list[str] = []

    def note(text: str) -> None:
        notes.append(text)
        log.info("get maps: %s", text)
        if on_note is not None:
            on_note(text)

    # The fingerprint (read once per process and kept) says the layers: a second full GGUF read is slow on
    # a large vocabulary (docs/measurements/speed.md#full-gguf-read-on-gemma-3).
    n_layer = int(model_fingerprint(model_path)["metadata"]["block_count"])
    if not 1 <= int(split) <= n_layer - 2:
        raise RidgeFillError(f"A split must lie in 1..{n_layer - 2} for this {n_layer}-layer model, not {split}.")
    split = int(split)
    local = out_dir is None

    if local and not refit:
        from .maps_hub import local_map_sets

        have = local_map_sets(model_path, settings).get(split)
        if have is not None:
            return GetMapsResult(str(have.folder), split, "cached", have.status, list(have.reasons), notes)
        if download:
            got = _try_download(model_path, split, settings, note, on_download, cancel)
            if got is not None:
                return GetMapsResult(got[0], split, "downloaded", got[1], got[2], notes)

    if cancel is not None and cancel():
        raise Cancelled("Get maps cancelled before fitting.")
    return _fit(model_path, split, settings, Path(out_dir) if out_dir is not None else settings.maps_dir,
                map_dtype, capture, engine, on_progress, note, cancel, disk_free, notes)


def _try_download(model_path: Path, split: int, settings: HubSettings, note, on_download, cancel):
    """(folder, status, warnings) of the published set, downloaded and verified; None (with a note
    saying why) when there is none to have, so the caller fits one."""
    from .maps_hub import download_maps

    entry = entry_for(model_path, settings)
    if entry is None:
        note("this model is not in the catalogue, so no set can be published for it: fitting locally")
        return None
    def relay(ev) -> None:  # a download that ends "failed" here is followed by a fit: the note says why
        if on_download is not None and ev.state is not State.FAILED:
            on_download(ev)

    job = DownloadJob(f"maps {entry.id} split {split}", on_event=relay)
    try:
        folder = download_maps(entry, split, model_path, settings, job)
    except (MapsNotPublished, NotCachedOffline) as exc:
        note(f"{_first_sentence(str(exc))}: fitting locally")
        return None
    except VerificationFailed as exc:
        note(f"the published set was refused ({exc}): fitting locally")
        return None
    except Cancelled:
        raise
    except HubError as exc:  # the hub cannot be reached: a set fitted here is as good
        note(f"the hub could not be asked ({_first_sentence(str(exc))}): fitting locally")
        return None
    if cancel is not None and cancel():
        raise Cancelled("Get maps cancelled.")
    verdict_warnings = list(job.warnings)
    return str(folder), ("warning" if verdict_warnings else "verified"), verdict_warnings


def _first_sentence(text: str) -> str:
    return text.split(". ")[0].rstrip(".")


def _fit(model_path: Path, split: int, settings: HubSettings, out_dir: Path, map_dtype: str,
         capture: CaptureOptions, engine, on_progress, note, cancel, disk_free, notes) -> GetMapsResult:
    from backend.ridgefill import activation_store, calibration
    from backend.ridgefill.fingerprint import model_fingerprint
    from backend.ridgefill.fitting import fit_map_set
    from backend.ridgefill.map_store import map_folder_name
    from backend.ridgefill.maps import check_maps

    lock = _lock(settings, model_path, cancel, note)
    try:
        final_name = map_folder_name(model_fingerprint(model_path, layers=[]), split)
        for gone in remove_stale_staging(out_dir, final_name):
            note(f"removed {gone.name}, a map folder left half-written by an interrupted fit")
        if capture.recapture:  # asked for: the whole cache of this model goes, parts included
            folder = activation_store.cache_folder(model_path)
            if folder.is_dir():
                shutil.rmtree(folder)
                note("capturing the calibration activations again (--recapture)")
        acts = calibration.current_activations(model_path)
        captured_now = acts is None
        if acts is None:
            state = activation_store.capture_state(model_path)
            if state:
                note(f"an unfinished capture of this model was found ({len(state.get('done', []))} of "
                     f"{state.get('sequences', '?')} sequences): resuming it")
            acts = calibration.ensure_activations(
                model_path, on_progress=on_progress, cancel=cancel, engine=engine,
                stride=capture.stride or calibration.DEFAULT_STRIDE, max_tokens=capture.max_tokens,
                seq_tokens=capture.seq_tokens or calibration.MAX_SEQ_TOKENS,
                on_plan=lambda plan: note(plan.summary()), disk_free=disk_free, n_threads=capture.threads,
            )
            f = acts.facts
            note(f"captured {f['tokens']:,} tokens in {f.get('last_run_seconds', f['capture_seconds']):,.0f} s "
                 f"({f.get('captured_sequences', f['sequences'])} sequences this time, "
                 f"{f.get('resumed_sequences', 0)} kept from before)")
        t0 = time.perf_counter()
        folder = fit_map_set(model_path, split, out_dir=out_dir, on_progress=on_progress, cancel=cancel,
                             map_dtype=map_dtype, engine=engine)
        fit_s = time.perf_counter() - t0
    finally:
        lock.release()
    verdict = check_maps(folder, model_path)  # verified like a download: sha256 of every file, fingerprint
    if verdict.status not in ("verified", "warning"):
        shutil.rmtree(folder, ignore_errors=True)
        raise RidgeFillError(f"The map set just fitted did not verify ({'; '.join(verdict.reasons)}); it was "
                             "removed. Get maps again; if it fails again, capture again (fit-maps --recapture).")
    keep = ("tokens", "rows", "sequences", "captured_sequences", "resumed_sequences", "capture_seconds",
            "last_run_seconds", "bytes", "cache_version")
    facts = {k: acts.facts[k] for k in keep if k in acts.facts}
    facts["captured_now"] = captured_now  # False: fitted from activations captured before
    return GetMapsResult(str(folder), split, "fitted", verdict.status, list(verdict.reasons), notes, facts,
                         round(fit_s, 2))
