"""RidgeFill map sets on the hub: the naming convention, downloads into the user cache, publishing.

Convention (documented in docs of `python -m app maps --help` too):
    repo   <owner>/ridgefill-maps-<model id>     owner: HubSettings.maps_owner (default "ridgefill")
    folder split-<S>/                             one folder per split: ridgefill.json + *.safetensors
    README.md at the repo root                    never listed in a manifest (the hub rewrites it)
The model id is the catalogue id (catalogue.json), e.g. ridgefill/ridgefill-maps-smollm2-135m-instruct-q4_1.

A download lands in <cache>/maps/<name find_maps prefers>/ only after every file matched the hub's size and
sha256 and `check_maps(folder, model_path)` (backend/ridgefill/maps.py) said "verified" or "warning";
a folder that does not match the model is refused with the reason and the model runs exact.
A set that is not published raises MapsNotPublished, which tells the user to fit one locally;
backend/hub/get_maps.py (Get maps) catches it and fits the set here.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from huggingface_hub import HfApi
from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError
from huggingface_hub.hf_api import RepoFile, RepoFolder

from backend.embedded_models import DEFAULT_FILE

from . import store
from .catalogue import ModelEntry
from .downloads import _hf_download, claim_staging, run_job, verify_file
from .errors import HubError, MapsNotPublished, NotCachedOffline, VerificationFailed, describe_error
from .jobs import DownloadJob, State
from .machine_fit import check_fit
from .settings import HubSettings

MANIFEST = "ridgefill.json"  # backend/ridgefill/map_format.py: MANIFEST
SPLIT_PREFIX = "split-"


def maps_repo_id(entry: ModelEntry, owner: str) -> str:
    return f"{owner}/ridgefill-maps-{entry.id}"


def split_folder(split: int) -> str:
    return f"{SPLIT_PREFIX}{int(split)}"


def fit_hint(entry: ModelEntry, split: int | None, model_path: Path | None = None) -> str:
    s = f" --split {split}" if split is not None else ""
    default = entry.embedded and entry.filename == DEFAULT_FILE  # the model `python -m app` opens unasked
    model = "" if default else f" --model {model_path or '<the ' + entry.id + ' file>'}"
    return f"Fit a map set locally instead: python -m app{model} fit-maps{s}"


def published_splits(entry: ModelEntry, settings: HubSettings) -> list[int]:
    """Splits published on the hub for this model ([] when the repo does not exist)."""
    api = HfApi(endpoint=settings.endpoint, token=settings.token or False)
    try:
        items = list(api.list_repo_tree(maps_repo_id(entry, settings.maps_owner)))
    except (RepositoryNotFoundError, RevisionNotFoundError):
        return []
    out = []
    for it in items:
        name = it.path.split("/")[0]
        if isinstance(it, RepoFolder) and name.startswith(SPLIT_PREFIX) and name[len(SPLIT_PREFIX):].isdigit():
            out.append(int(name[len(SPLIT_PREFIX):]))
    return sorted(set(out))


def check_folder(folder: Path, model_path: Path):
    """MAPS's verdict on a folder: MapCheck(status, reasons, split, folder)."""
    from backend.ridgefill.maps import check_maps

    return check_maps(folder, model_path)


def search_dirs(settings: HubSettings) -> list[Path]:
    """Where map folders for a model are looked for: the user cache, then the shipped maps_cache/."""
    from backend.ridgefill.map_store import shipped_maps_dir

    return [settings.maps_dir, shipped_maps_dir()]


def local_map_sets(model_path: Path, settings: HubSettings) -> dict[int, "object"]:
    """split -> MapCheck for every map folder on disk that is usable with this model (verified or
    warning); the user cache wins over the shipped folder for the same split."""
    from backend.ridgefill.map_format import MANIFEST as MANIFEST_NAME

    found: dict[int, object] = {}
    for d in search_dirs(settings):
        if not Path(d).is_dir():
            continue
        for sub in sorted(Path(d).iterdir()):
            if sub.name.startswith(".") or not (sub / MANIFEST_NAME).is_file():
                continue  # a hidden folder is a set being written (or left by a killed writer): never used
            verdict = check_folder(sub, model_path)
            if verdict.status in ("verified", "warning") and verdict.split is not None:
                found.setdefault(verdict.split, verdict)
    return found


def install_name(model_path: Path, split: int) -> str:
    """The folder name find_maps prefers for this model and split (backend/ridgefill/map_store.py)."""
    from backend.ridgefill.fingerprint import model_fingerprint
    from backend.ridgefill.map_store import map_folder_name

    return map_folder_name(model_fingerprint(model_path, layers=[]), split)


def download_maps(entry: ModelEntry, split: int | None, model_path: Path, settings: HubSettings,
                  job: DownloadJob | None = None) -> Path:
    """Download the map set of `entry` at `split` (None: the lowest published split), verify it
    against `model_path` and install it where find_maps looks; returns the installed folder."""
    job = job or DownloadJob(f"maps {entry.id}")
    return run_job(job, lambda: _run(entry, split, Path(model_path), settings, job),
                   maps_repo_id(entry, settings.maps_owner))


def _run(entry: ModelEntry, split: int | None, model_path: Path, settings: HubSettings, job: DownloadJob) -> Path:
    have = local_map_sets(model_path, settings)
    if split is not None and split in have:
        job.warnings.extend(have[split].reasons if have[split].status == "warning" else [])
        job.move(State.READY, path=str(have[split].folder))
        return Path(have[split].folder)
    repo_id = maps_repo_id(entry, settings.maps_owner)
    if settings.offline:
        cached = ", ".join(f"split {s}" for s in sorted(have)) or "none"
        raise NotCachedOffline(
            f"Offline: the map set {repo_id} (split {split if split is not None else 'any'}) is not cached "
            f"(cached for {entry.id}: {cached}). Go online to download it, or fit one locally."
        )

    api = HfApi(endpoint=settings.endpoint, token=settings.token or False)
    try:
        commit = api.model_info(repo_id).sha
    except RepositoryNotFoundError as exc:
        raise MapsNotPublished(f"No map set is published for {entry.id} ({repo_id} does not exist). {fit_hint(entry, split, model_path)}") from exc
    if split is None:
        splits = published_splits(entry, settings)
        if not splits:
            raise MapsNotPublished(f"{repo_id} has no split-<S>/ folder. {fit_hint(entry, None, model_path)}")
        split = splits[0]
    folder = split_folder(split)
    try:
        files = [f for f in api.list_repo_tree(repo_id, path_in_repo=folder, recursive=True, revision=commit)
                 if isinstance(f, RepoFile)]
    except EntryNotFoundError:
        files = []
    if not any(f.path == f"{folder}/{MANIFEST}" for f in files):
        avail = ", ".join(str(s) for s in published_splits(entry, settings)) or "none"
        raise MapsNotPublished(f"{repo_id} has no map set for split {split} (published splits: {avail}). {fit_hint(entry, split, model_path)}")
    files = [f for f in files if Path(f.path).name.lower() != "readme.md"]  # docs are never part of a set

    job.total = sum(f.size for f in files)
    report = check_fit(job.total, settings.staging_dir, settings.disk_free)
    job.fit = report.summary()
    report.require_disk()
    final = settings.maps_dir / install_name(model_path, split)
    with claim_staging(settings, staging_name(entry, split), job) as staging:
        if (final / MANIFEST).is_file():  # another download may have installed it while this one waited
            verdict = check_folder(final, model_path)
            if verdict.status in ("verified", "warning"):
                job.warnings.extend(verdict.reasons if verdict.status == "warning" else [])
                job.move(State.READY, path=str(final))
                return final
        return _fetch_set(staging, final, repo_id, commit, folder, files, model_path, job, settings)


def staging_name(entry: ModelEntry, split: int) -> str:
    """The staging folder (below HubSettings.staging_dir) of a map download, claimed while it runs."""
    return f"maps-{entry.id}-{split_folder(split)}"


def _fetch_set(staging: Path, final: Path, repo_id: str, commit: str, folder: str, files: list, model_path: Path,
               job: DownloadJob, settings: HubSettings) -> Path:
    store.remove_quietly(staging)  # a clean restart: map files are small, nothing worth resuming
    try:  # any failure from here on leaves no staged file behind
        job.move(State.DOWNLOADING)
        for f in files:
            job.file = f.path
            _hf_download(repo_id, f.path, commit, staging, settings, job)

        job.move(State.VERIFYING)
        staged = staging / folder
        for f in files:  # transport check against the hub's own size and LFS sha256
            verify_file(staging / f.path, f.size, f.lfs.sha256 if f.lfs else None, job)
        verdict = check_folder(staged, model_path)
        if verdict.status not in ("verified", "warning"):
            store.remove_quietly(staging)
            raise VerificationFailed(
                f"The map set {repo_id}/{folder} was refused for {model_path.name}: "
                f"{'; '.join(verdict.reasons) or verdict.status} The model runs exact."
            )
        if verdict.status == "warning":
            job.warnings.extend(verdict.reasons)
    except BaseException:
        store.remove_quietly(staging)
        raise
    store.install_folder(staged, final)
    store.remove_quietly(staging)
    job.move(State.READY, path=str(final))
    return final


# --- publishing -------------------------------------------------------------------------------

def check_publishable(folder: Path) -> tuple[dict, dict[str, str]]:
    """The manifest and its files (name -> sha256), after the checks a download will make: the manifest
    map_format.read_manifest takes (plain .safetensors/.json names in the folder, so neither a path outside
    it nor README.md, which the hub rewrites), every listed file a regular file (not a link) whose sha256 matches."""
    from backend.ridgefill.map_format import FormatError, read_manifest, verify_files

    folder = Path(folder)
    try:
        manifest = read_manifest(folder)
    except FileNotFoundError as exc:
        raise HubError(f"{folder} is not a map folder: it has no {MANIFEST}.") from exc
    except (FormatError, TypeError, ValueError, RecursionError) as exc:  # read_manifest lets these escape on some malformed manifests
        raise HubError(f"{folder}/{MANIFEST} cannot be published: {exc}. Fit the maps again, or fix the manifest.") from exc
    files = manifest["files"]
    if not files:
        raise HubError(f"{folder}/{MANIFEST} lists no files.")
    links = [n for n in files if (folder / n).is_symlink()]
    if links:
        raise HubError(f"{links[0]}, listed in the manifest, is a link; copy the file itself into {folder}.")
    problems = verify_files(folder, manifest)
    if problems:
        raise HubError(f"{folder}: {problems[0]}; refit or copy the folder again.")
    return manifest, {str(k): str(v) for k, v in files.items()}


def readme_text(repo_id: str, split: int, manifest: dict) -> str:
    arch = manifest.get("architecture") or manifest.get("arch") or ""
    return (
        "---\ntags:\n- ridgefill\n- ridgefill-maps\n---\n"
        f"# {repo_id}\n\nRidgeFill map sets (ridge maps that predict late-layer inputs for prefill skipping)"
        f"{' for a ' + arch + ' model' if arch else ''}, published with `python -m app publish-maps`.\n\n"
        "One folder per split `split-<S>/`: `ridgefill.json` (manifest with the model fingerprint and the "
        "sha256 of every file) and safetensors maps. This README is not part of any manifest.\n\n"
        f"Latest upload: split {split}.\n"
    )


def publish_maps(folder: Path, repo_id: str, settings: HubSettings, private: bool = False) -> str:
    """Upload a verified map folder as <repo>/split-<S>/ (+ a README.md at the root); returns the commit URL."""
    if settings.offline:
        raise HubError("Offline: publishing needs the hub. Drop --offline.")
    manifest, files = check_publishable(Path(folder))
    split = int(manifest["split"])
    api = HfApi(endpoint=settings.endpoint, token=settings.token or False)
    with tempfile.TemporaryDirectory(prefix="ridgefill-publish-") as tmp:
        root = Path(tmp)
        dest = root / split_folder(split)
        dest.mkdir()
        for name in [MANIFEST, *files]:
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(Path(folder) / name, dest / name)
        (root / "README.md").write_text(readme_text(repo_id, split, manifest), encoding="utf-8")
        try:
            api.create_repo(repo_id, private=private, exist_ok=True)
            info = api.upload_folder(folder_path=root, repo_id=repo_id,
                                     commit_message=f"RidgeFill maps, split {split}")
        except Exception as exc:
            raise HubError(describe_error(exc, repo_id)) from exc
    return str(getattr(info, "commit_url", info))
