"""Model downloads through huggingface_hub, with progress, cancel, verification and atomic placement.

`download_model(entry, settings, job)` runs in the caller's thread (a GUI runs it in a worker and calls
`job.cancel()` from its own). Steps, each a state of the job (jobs.py):
  queued       already installed? offline? -> ready / failed
               claim <cache>/downloads/<id>/ (claim_staging): a second download of the same model waits
               here, cancellable, and then finds it installed -> ready
               HEAD on the hub (size, sha256 from X-Linked-Etag, commit); disk fit -> failed with numbers
  downloading  hf_hub_download(local_dir=<cache>/downloads/<id>) with a tqdm bridge for bytes and cancel;
               the library writes a unique temporary file and renames it when whole, retries dropped
               connections with a Range request (resume inside one call) and deletes its temporary
               file on any failure, so a restart after a crash or a cancel starts clean.
  verifying    size, then sha256 (the catalogue's, else the hub's LFS hash), then the GGUF magic
  ready        os.replace into <cache>/models/<id>/ and only then the installed.json record
"""
from __future__ import annotations

import errno
import hashlib
import logging
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from filelock import FileLock, Timeout  # huggingface_hub's own dependency (it locks its cache with it)
from huggingface_hub import constants as hf_constants
from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url

from backend.model_file import GGUF_MAGIC, read_model_info

from . import store
from .catalogue import ModelEntry
from .errors import (
    DownloadCancelled,
    HubError,
    NotCachedOffline,
    NotEnoughDisk,
    VerificationFailed,
    describe_error,
)
from .jobs import DownloadJob, State
from .machine_fit import check_fit
from .progress import bridge_class
from .settings import HubSettings

T = TypeVar("T")

log = logging.getLogger(__name__)

# Smaller chunks than the library's 10 MB so progress and cancel respond at least every MiB.
hf_constants.DOWNLOAD_CHUNK_SIZE = min(hf_constants.DOWNLOAD_CHUNK_SIZE, 1024 * 1024)
# Plain HTTP (resolve URLs, Range resume) rather than hf_xet: xet reports progress from a native
# thread through two bars and cannot be stopped from a progress callback, so exact byte progress and
# cancel between chunks would be lost. The hub serves every file over plain HTTP too.
hf_constants.HF_HUB_DISABLE_XET = True
HASH_CHUNK = 4 * 1024 * 1024
LOCK_POLL_S = 0.2  # how often a download waiting for a staging folder checks its cancel
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def download_model(entry: ModelEntry, settings: HubSettings, job: DownloadJob | None = None) -> Path:
    """Download, verify and install one catalogue entry; returns the verified file.

    Raises a HubError (or DownloadCancelled) whose message is the job's failure reason.
    """
    job = job or DownloadJob(entry.id)
    return run_job(job, lambda: _run(entry, settings, job), entry.repo_id or entry.id)


def run_job(job: DownloadJob, work: Callable[[], T], what: str) -> T:
    """Run a download's `work`; whatever goes wrong ends `job` failed with a reason (and raises)."""
    try:
        return work()
    except (DownloadCancelled, KeyboardInterrupt):
        job.fail("cancelled by the user; nothing was kept")
        raise
    except HubError as exc:
        job.fail(str(exc))
        raise
    except Exception as exc:  # anything else still ends in a clear state
        reason = describe_error(exc, what)
        job.fail(reason)
        raise HubError(reason) from exc


def _run(entry: ModelEntry, settings: HubSettings, job: DownloadJob) -> Path:
    installed = store.model_path(entry, settings)
    if installed is not None:
        job.move(State.READY, path=str(installed))
        return installed
    if not entry.on_hub:
        raise HubError(f"{entry.id}: the file {entry.local_path or entry.filename} is missing. Add it again.")
    if settings.offline:
        raise NotCachedOffline(
            f"Offline: {entry.id} ({entry.repo_id}/{entry.filename}) is not in the cache. "
            "Go online (drop --offline) to download it."
        )
    with claim_staging(settings, entry.id, job) as staging:
        installed = store.model_path(entry, settings)  # another download may have installed it meanwhile
        if installed is not None:
            job.move(State.READY, path=str(installed))
            return installed
        return _download_into(staging, entry, settings, job)


def _download_into(staging: Path, entry: ModelEntry, settings: HubSettings, job: DownloadJob) -> Path:
    meta = get_hf_file_metadata(
        hf_hub_url(entry.repo_id, entry.filename, revision=entry.revision, endpoint=settings.endpoint),
        token=settings.token or False, endpoint=settings.endpoint,
    )
    size = meta.size if meta.size is not None else entry.size_bytes
    hub_sha = (meta.etag or "").lower() if _SHA256.match((meta.etag or "").lower()) else None
    expected_sha = (entry.sha256 or hub_sha or "").lower() or None
    if entry.sha256 and hub_sha and entry.sha256.lower() != hub_sha:
        raise VerificationFailed(
            f"{entry.repo_id}/{entry.filename} on the hub (sha256 {hub_sha[:12]}…) is not the file the catalogue "
            f"names (sha256 {entry.sha256[:12]}…): the repo changed. Refusing it."
        )
    job.total = size
    job.file = entry.filename
    if size:
        report = check_fit(size, settings.staging_dir, settings.disk_free)
        job.fit = report.summary()
        report.require_disk()

    _clean_stale_partials(staging)  # left by a download that no longer runs: we hold the claim
    job.move(State.DOWNLOADING)
    try:  # a failure from here on leaves nothing staged (the library already dropped its temp file)
        staged = Path(
            _hf_download(entry.repo_id, entry.filename, meta.commit_hash or entry.revision, staging, settings, job)
        )
        job.move(State.VERIFYING)
        verify_file(staged, size, expected_sha, job)
        with staged.open("rb") as f:
            if f.read(4) != GGUF_MAGIC:
                raise VerificationFailed(f"{entry.filename} is not a GGUF file (bad magic); it was deleted.")
        facts = _header_facts(staged, entry)
    except BaseException:
        store.remove_quietly(staging)
        raise
    final = store.install_model(
        staged, entry, settings,
        {"id": entry.id, "repo_id": entry.repo_id, "revision": entry.revision, "commit": meta.commit_hash,
         "sha256": expected_sha, "verified_by": "sha256" if expected_sha else "size", **facts},
    )
    store.remove_quietly(staging)
    job.move(State.READY, path=str(final))
    return final


def _header_facts(staged: Path, entry: ModelEntry) -> dict:
    """Facts a user-added entry lacks, read from the verified file's header; a header the reader refuses,
    whatever it raised, is a failed verification (the caller deletes the file)."""
    try:
        info = read_model_info(staged)
    except Exception as exc:  # ModelFileError by contract; anything else must not leave the file either
        raise VerificationFailed(f"{entry.filename} is not a usable GGUF model ({exc}); it was deleted.") from exc
    return {"architecture": info.architecture, "context_length": info.n_ctx_train, "name": info.name}


@contextmanager
def claim_staging(settings: HubSettings, name: str, job: DownloadJob) -> Iterator[Path]:
    """<cache>/downloads/<name>/ for this download alone, while the block runs.

    Two downloads of the same thing at once (two windows, the GUI and the CLI) would otherwise share the
    folder: the second's clean-up deletes the first's partial file, and either one's failure wipes the
    other's. So the second waits here, told why (job.note) and free to cancel, until the first has ended;
    then it finds the thing installed, or downloads it itself if the first failed. Waiting rather than
    refusing: the waiter gets what it asked for without fetching the same gigabytes twice. A unique
    folder per download would not stop the two installs racing, and could not tell a live partial from a
    crashed one. The claim is an OS file lock (filelock) in <cache>/locks/, so it holds across threads
    and processes and a killed process lets go of it; whatever the folder holds once the claim is taken
    was left by a download that no longer runs.
    """
    lock = FileLock(str(settings.locks_dir / f"{name}.lock"))
    while True:
        try:
            lock.acquire(timeout=LOCK_POLL_S)
            break
        except Timeout:
            if job.cancelled:
                raise DownloadCancelled("Download cancelled while it waited for another download of the same files.")
            if not job.note:
                job.say(f"waiting: another download of {name} is running (here or in another RidgeFill "
                        "process); this one goes on when it ends")
    try:
        yield settings.staging_dir / name
    finally:
        lock.release()


def _hf_download(repo_id: str, filename: str, revision: str, local_dir: Path, settings: HubSettings,
                 job: DownloadJob) -> str:
    bar = bridge_class(job.add_bytes, lambda: job.cancelled)
    try:
        return hf_hub_download(
            repo_id, filename, revision=revision, local_dir=local_dir, cache_dir=settings.hf_cache_dir,
            endpoint=settings.endpoint, token=settings.token or False, tqdm_class=bar,
        )
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise NotEnoughDisk(job.total or 0, settings.disk_free(local_dir), str(local_dir)) from exc
        raise


def verify_file(path: Path, size: int | None, sha256: str | None, job: DownloadJob) -> None:
    """Size, then sha256 (with progress and cancel); a mismatch deletes the file."""
    actual = path.stat().st_size
    if size is not None and actual != size:
        store.remove_quietly(path)
        raise VerificationFailed(f"{path.name}: got {actual:,} bytes, expected {size:,}; the download was deleted. Try again.")
    if sha256 is None:
        return
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(HASH_CHUNK):
            if job.cancelled:
                store.remove_quietly(path)
                raise DownloadCancelled("Download cancelled.")
            h.update(chunk)
            job.add_bytes(len(chunk))
    if h.hexdigest() != sha256:
        store.remove_quietly(path)
        raise VerificationFailed(
            f"{path.name}: sha256 {h.hexdigest()[:16]}… does not match the expected {sha256[:16]}…; the file is "
            "corrupt and was deleted. Try the download again."
        )


def _clean_stale_partials(staging: Path) -> None:
    """Temporary files a killed process left behind (the library names them *.incomplete)."""
    if staging.is_dir():
        for p in staging.rglob("*.incomplete"):
            p.unlink(missing_ok=True)
