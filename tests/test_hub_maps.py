"""Map sets on a local stand-in hub: download + verification against the model, refusal, publishing,
and the CLI end to end (model + maps from the test hub into a fresh cache, then `speed` runs)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from backend.embedded_models import embedded_model_path
from backend.hub.catalogue import ModelEntry, load_catalogue
from backend.hub.errors import HubError, MapsNotPublished, NotCachedOffline, VerificationFailed
from backend.hub.jobs import DownloadJob, State
from backend.hub.maps_hub import download_maps, local_map_sets, maps_repo_id, publish_maps, published_splits
from backend.hub.settings import HubSettings
from backend.model_file import read_model_info
from backend.ridgefill.fingerprint import model_fingerprint
from backend.ridgefill.map_format import write_map_folder
from backend.ridgefill.maps import find_maps
from tests.hub_server import FakeHub
from tests.test_hub_downloads import write_tiny_gguf

MODEL = embedded_model_path()
OWNER = "maps-test"


def make_map_folder(folder: Path, split: int, seed: int = 0) -> Path:
    """A valid map set for the embedded model (random maps: the hub checks transport and fit, not quality)."""
    info = read_model_info(MODEL)
    n, d = info.n_layer, info.n_embd
    g = torch.Generator().manual_seed(seed)
    layers = list(range(split + 1, n))
    weights = {l: torch.eye(d) + 0.01 * torch.randn(d, d, generator=g) for l in layers}
    biases = {l: torch.zeros(d) for l in layers}
    return write_map_folder(
        folder, split=split, n_layer=n, weights=weights, biases=biases,
        fingerprint=model_fingerprint(MODEL, layers=list(range(split, n))),
        lambdas={l: 0.01 for l in layers}, heldout_cosine={l: 0.5 for l in layers},
        calibration={"note": "random maps for the hub tests"},
    )


@pytest.fixture(scope="module")
def smol_entry() -> ModelEntry:
    return next(e for e in load_catalogue() if e.id == "smollm2-135m-instruct-q4_1")


@pytest.fixture(scope="module")
def maps28(tmp_path_factory) -> Path:
    return make_map_folder(tmp_path_factory.mktemp("maps") / "smol-s28", 28)


@pytest.fixture
def hub(maps28, smol_entry):
    h = FakeHub(token="write-token").start()
    h.add_folder(maps_repo_id(smol_entry, OWNER), maps28, prefix="split-28/")
    h.add_file(maps_repo_id(smol_entry, OWNER), "README.md", b"# maps\n")
    yield h
    h.stop()


@pytest.fixture
def settings(hub, tmp_path, monkeypatch) -> HubSettings:
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("RIDGEFILL_HOME", str(tmp_path / "home"))
    from backend.user_paths import cache_dir

    # The same cache the app and find_maps' default search use, so the engine sees downloads.
    return HubSettings(cache_root=cache_dir(), endpoint=hub.url, maps_owner=OWNER)


def test_map_download_is_verified_and_found_by_the_engine(hub, settings, smol_entry):
    events = []
    job = DownloadJob("maps", on_event=events.append)
    folder = download_maps(smol_entry, 28, MODEL, settings, job)
    assert job.history == [State.QUEUED, State.DOWNLOADING, State.VERIFYING, State.READY]
    assert folder.parent == settings.maps_dir and (folder / "ridgefill.json").is_file()
    assert not (folder / "README.md").exists()
    assert max(e.done for e in events if e.state is State.DOWNLOADING) == job.total > 0
    # The engine's own lookup (default dirs under RIDGEFILL_HOME) finds and loads the downloaded set.
    maps = find_maps(MODEL, 28)
    assert maps.folder == folder and maps.layers == [29] and not maps.warnings
    assert local_map_sets(MODEL, settings)[28].status == "verified"
    assert published_splits(smol_entry, settings) == [28]
    # Asked again, it is already there: no download.
    job2 = DownloadJob("maps")
    assert download_maps(smol_entry, 28, MODEL, settings, job2) == folder
    assert job2.history == [State.QUEUED, State.READY]


def test_corrupted_map_byte_is_refused(hub, settings, smol_entry):
    hub.corrupt.add((maps_repo_id(smol_entry, OWNER), "split-28/layer_029.safetensors"))
    job = DownloadJob("maps")
    with pytest.raises(VerificationFailed, match="sha256"):
        download_maps(smol_entry, 28, MODEL, settings, job)
    assert job.state is State.FAILED and job.history[-2] is State.VERIFYING
    assert not any(settings.maps_dir.iterdir()) and not any(settings.staging_dir.iterdir())


def test_maps_for_another_model_are_refused_with_the_reason(hub, settings, smol_entry, tmp_path):
    other = tmp_path / "other.gguf"
    write_tiny_gguf(other, n_floats=1000)
    job = DownloadJob("maps")
    with pytest.raises(VerificationFailed, match="refused") as err:
        download_maps(smol_entry, 28, other, settings, job)
    assert "runs exact" in str(err.value) and job.state is State.FAILED
    assert not any(settings.maps_dir.iterdir())


def test_unpublished_maps_point_to_local_fitting(hub, settings, smol_entry):
    with pytest.raises(MapsNotPublished, match="fit-maps --split 20") as err:  # 20: not shipped either
        download_maps(smol_entry, 20, MODEL, settings)
    assert "published splits: 28" in str(err.value)
    nobody = replace(settings, maps_owner="nobody")
    with pytest.raises(MapsNotPublished, match="does not exist"):
        download_maps(smol_entry, 20, MODEL, nobody)


def test_offline_maps_say_what_is_cached(hub, settings, smol_entry):
    download_maps(smol_entry, 28, MODEL, settings)
    n = len(hub.requests)
    offline = replace(settings, offline=True)
    assert download_maps(smol_entry, 28, MODEL, offline).name.endswith("-s28")
    with pytest.raises(NotCachedOffline, match="cached for .*split 28"):
        download_maps(smol_entry, 20, MODEL, offline)
    assert len(hub.requests) == n


def test_publish_maps_uploads_a_folder_the_app_can_download(hub, settings, smol_entry, tmp_path):
    folder = make_map_folder(tmp_path / "pub-s27", 27, seed=1)
    (folder / "README.md").write_text("local notes, not part of the set\n")
    repo = "someone/ridgefill-maps-smollm2-135m-instruct-q4_1"
    with pytest.raises(HubError, match="not found|credentials|401"):
        publish_maps(folder, repo, replace(settings, token=None))
    url = publish_maps(folder, repo, replace(settings, token="write-token"))
    files = hub.repos[repo].files
    assert url.endswith(hub.repos[repo].commit)
    manifest = json.loads(files["split-27/ridgefill.json"])
    assert set(files) == {"README.md", "split-27/ridgefill.json", *[f"split-27/{n}" for n in manifest["files"]]}
    for name, sha in manifest["files"].items():
        assert hashlib.sha256(files[f"split-27/{name}"]).hexdigest() == sha
    assert "README.md" not in manifest["files"]
    # The published set round-trips through the download path.
    got = download_maps(smol_entry, 27, MODEL, replace(settings, maps_owner="someone"))
    assert find_maps(MODEL, 27).folder == got


def test_publish_refuses_a_manifest_that_lists_readme(settings, tmp_path):
    folder = make_map_folder(tmp_path / "bad-s28", 28)
    m = json.loads((folder / "ridgefill.json").read_text())
    (folder / "README.md").write_text("x")
    m["files"]["README.md"] = hashlib.sha256(b"x").hexdigest()
    (folder / "ridgefill.json").write_text(json.dumps(m))
    with pytest.raises(HubError, match="README.md"):
        publish_maps(folder, "someone/x", settings)


def test_a_map_download_waits_while_another_download_holds_its_staging(hub, settings, smol_entry):
    """Another download of the same set (another window or process) is using the staging folder: this
    one waits, says so, leaves the other's partial file alone, and goes on once the other has ended."""
    import threading

    from backend.hub.downloads import claim_staging
    from backend.hub.maps_hub import staging_name

    job, noted, result = DownloadJob("maps"), threading.Event(), {}
    job.on_event = lambda e: noted.set() if e.note else None
    worker = threading.Thread(target=lambda: result.update(folder=download_maps(smol_entry, 28, MODEL, settings, job)))
    with claim_staging(settings, staging_name(smol_entry, 28), DownloadJob("other")) as staging:
        staging.mkdir(parents=True)
        (staging / "partial").write_bytes(b"the other download's bytes")
        worker.start()
        assert noted.wait(30) and "another download" in job.note
        assert job.state is State.QUEUED and (staging / "partial").read_bytes() == b"the other download's bytes"
    worker.join(60)
    assert job.state is State.READY and local_map_sets(MODEL, settings)[28].folder == result["folder"]
