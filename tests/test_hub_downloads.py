"""Model downloads from a local stand-in hub (tests/hub_server.py) through the real huggingface_hub client."""
from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from backend.hub import store
from backend.hub.catalogue import ModelEntry, add_hub, add_local, find_entry, load_catalogue
from backend.hub.downloads import download_model
from backend.hub.errors import DownloadCancelled, HubError, NotCachedOffline, NotEnoughDisk, VerificationFailed
from backend.hub.jobs import DownloadJob, State
from backend.hub.machine_fit import check_fit
from backend.hub.settings import HubSettings
from tests.hub_server import FakeHub

REPO = "test-org/tiny-GGUF"
FILE = "tiny-Q8_0.gguf"


def write_tiny_gguf(path: Path, n_floats: int = 400_000, name: str = "tiny test model") -> bytes:
    """A small but valid GGUF (llama metadata, one tensor of random floats): ~1.6 MB."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_context_length(512)
    w.add_tensor("token_embd.weight", np.random.default_rng(0).standard_normal(n_floats).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> bytes:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / FILE)


@pytest.fixture
def hub(tiny):
    h = FakeHub().start()
    h.add_file(REPO, FILE, tiny)
    h.add_file(REPO, "README.md", b"# tiny\n")
    yield h
    h.stop()


@pytest.fixture
def settings(hub, tmp_path, monkeypatch) -> HubSettings:
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    return HubSettings(cache_root=tmp_path / "cache", endpoint=hub.url, token=None)


def entry(tiny: bytes, **kw) -> ModelEntry:
    base = ModelEntry(id="tiny-q8_0", name="tiny", architecture="llama", repo_id=REPO, filename=FILE,
                      quantization="Q8_0", size_bytes=len(tiny), size_exact=True,
                      sha256=hashlib.sha256(tiny).hexdigest(), context_length=512, licence="mit")
    return replace(base, **kw)


def test_download_reports_progress_and_installs_verified(hub, settings, tiny):
    events = []
    job = DownloadJob("tiny", on_event=events.append)
    path = download_model(entry(tiny), settings, job)
    assert path.read_bytes() == tiny
    assert path.parent == settings.models_dir / "tiny-q8_0"
    assert job.history == [State.QUEUED, State.DOWNLOADING, State.VERIFYING, State.READY]
    downloading = [e.done for e in events if e.state is State.DOWNLOADING]
    assert len(downloading) >= 2 and downloading == sorted(downloading)  # several chunks, growing
    assert downloading[-1] == len(tiny) and events[-1].total == len(tiny)
    assert any(e.state is State.VERIFYING and e.done == len(tiny) for e in events)  # hashed every byte
    assert "disk: needs" in job.fit and "memory: needs" in job.fit  # shown before the bytes flow
    rec = json.loads((path.parent / store.RECORD).read_text())
    assert rec["sha256"] == hashlib.sha256(tiny).hexdigest() and rec["verified_by"] == "sha256"
    assert rec["architecture"] == "llama" and rec["context_length"] == 512  # read from the verified header
    assert not (settings.staging_dir / "tiny-q8_0").exists()
    # The client asked with the hub's real routes: HEAD then GET on /resolve/.
    resolves = [(m, p) for m, p, _ in hub.requests if "/resolve/" in p]
    assert ("HEAD", f"/{REPO}/resolve/main/{FILE}") in resolves
    assert any(m == "GET" for m, _ in resolves)
    # A second call finds it installed and does not touch the network.
    n = len(hub.requests)
    job2 = DownloadJob("tiny")
    assert download_model(entry(tiny), settings, job2) == path
    assert job2.history == [State.QUEUED, State.READY] and len(hub.requests) == n


def test_hub_sha256_verifies_when_catalogue_has_none(hub, settings, tiny):
    path = download_model(entry(tiny, sha256=None, size_bytes=None, size_exact=False), settings)
    rec = json.loads((path.parent / store.RECORD).read_text())
    assert rec["sha256"] == hashlib.sha256(tiny).hexdigest()  # taken from the hub's X-Linked-Etag


def test_corrupted_byte_is_refused_and_nothing_installed(hub, settings, tiny):
    hub.corrupt.add((REPO, FILE))
    job = DownloadJob("tiny")
    with pytest.raises(VerificationFailed, match="sha256"):
        download_model(entry(tiny), settings, job)
    assert job.state is State.FAILED and "corrupt" in job.reason
    assert job.history[-2] is State.VERIFYING
    assert store.model_path(entry(tiny), settings) is None
    assert not list(settings.models_dir.rglob("*.gguf"))
    assert not list(settings.staging_dir.rglob("*.gguf"))


def test_dropped_connection_resumes_with_a_range_request(hub, settings, tiny, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)  # so whole chunks land before the cut
    monkeypatch.setattr("time.sleep", lambda s: None)
    hub.drop_after[(REPO, FILE)] = (len(tiny) // 3, 1)  # cut once, a third of the way in
    path = download_model(entry(tiny), settings)
    assert path.read_bytes() == tiny
    ranges = [h.get("Range") or h.get("range") for m, p, h in hub.requests if m == "GET" and p.endswith(FILE)]
    assert any(r and r.startswith("bytes=") and int(r[6:].split("-")[0]) > 0 for r in ranges)


def test_server_that_keeps_dropping_fails_cleanly_then_restarts(hub, settings, tiny, monkeypatch):
    monkeypatch.setattr("time.sleep", lambda s: None)  # the library waits 1 s between retries
    hub.drop_after[(REPO, FILE)] = (1000, 1000)  # every GET dies after 1000 bytes of the file
    job = DownloadJob("tiny")
    with pytest.raises(HubError) as err:
        download_model(entry(tiny, sha256=None), settings, job)
    assert job.state is State.FAILED and job.reason == str(err.value)
    assert store.model_path(entry(tiny), settings) is None
    assert not [p for p in settings.cache_root.rglob("*") if p.is_file() and p.suffix in (".gguf", ".incomplete")]
    hub.drop_after.clear()  # the server recovers: a new attempt starts clean and succeeds
    assert download_model(entry(tiny), settings).read_bytes() == tiny


def test_cancel_mid_file_leaves_nothing_taken_for_ready(hub, settings, tiny, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)
    hub.delay_s = 0.01
    job = DownloadJob("tiny")
    seen = threading.Event()

    def on_event(e):
        if e.state is State.DOWNLOADING and e.done > len(tiny) // 4:
            job.cancel()
            seen.set()

    job.on_event = on_event
    with pytest.raises(DownloadCancelled):
        download_model(entry(tiny), settings, job)
    assert seen.is_set() and job.state is State.FAILED and "cancelled" in job.reason
    assert 0 < job.done < len(tiny)
    assert store.model_path(entry(tiny), settings) is None
    leftovers = [p for p in settings.cache_root.rglob("*") if p.is_file() and (p.suffix in (".gguf", ".incomplete"))]
    assert leftovers == []


def test_disk_full_is_refused_with_numbers_before_downloading(hub, settings, tiny):
    settings.disk_free = lambda p: 1_000_000  # a 1 MB disk
    job = DownloadJob("tiny")
    with pytest.raises(NotEnoughDisk) as err:
        download_model(entry(tiny), settings, job)
    assert "1.0 MB free" in str(err.value) and f"{(len(tiny) + 64 * 1024 * 1024) / 1e6:,.1f} MB" in str(err.value)
    assert job.history == [State.QUEUED, State.FAILED]
    assert not any(m == "GET" and "/resolve/" in p for m, p, _ in hub.requests)
    report = check_fit(len(tiny), settings.staging_dir, settings.disk_free)
    assert not report.disk_ok and "DOES NOT FIT" in report.summary()
    assert check_fit(len(tiny), settings.staging_dir).disk_ok  # the real disk has room


def test_offline_lists_cached_and_refuses_the_rest(hub, settings, tiny):
    download_model(entry(tiny), settings)
    n = len(hub.requests)
    offline = replace(settings, offline=True)
    assert download_model(entry(tiny), offline).read_bytes() == tiny  # cached: fine offline
    other = entry(tiny, id="other", filename="other.gguf")
    job = DownloadJob("other")
    with pytest.raises(NotCachedOffline, match="not in the cache"):
        download_model(other, offline, job)
    assert job.state is State.FAILED and len(hub.requests) == n  # offline never touched the server


def test_file_in_a_repo_subfolder_installs_flat(hub, settings, tiny):
    hub.add_file(REPO, f"Q8_0/{FILE}", tiny)
    path = download_model(entry(tiny, id="sub", filename=f"Q8_0/{FILE}"), settings)
    assert path == settings.models_dir / "sub" / FILE and path.read_bytes() == tiny
    assert store.model_path(entry(tiny, id="sub", filename=f"Q8_0/{FILE}"), settings) == path


def test_missing_repo_and_file_fail_with_reasons(hub, settings, tiny):
    with pytest.raises(HubError, match="not found on the hub"):
        download_model(entry(tiny, repo_id="nobody/nothing"), settings)
    with pytest.raises(HubError, match="not in the repo"):
        download_model(entry(tiny, filename="absent.gguf"), settings)


def test_unreachable_endpoint_fails_with_reason(settings, tiny):
    dead = replace(settings, endpoint="http://127.0.0.1:9")
    job = DownloadJob("tiny")
    with pytest.raises(HubError, match="reach"):
        download_model(entry(tiny), dead, job)
    assert job.state is State.FAILED


def test_catalogue_has_real_entries_and_user_additions(tmp_path, hub, tiny):
    cat = load_catalogue()
    assert len(cat) >= 5 and {"llama", "qwen2", "qwen3", "gemma3"} <= {e.architecture for e in cat}
    for e in cat:  # the default's file ships in a package only (it has no hub repo of its own here)
        assert (e.repo_id or e.embedded) and e.filename.endswith(".gguf") and e.context_length and e.licence
        assert e.quantization and (e.sha256 or not e.embedded)
    emb = {e.filename: e for e in cat if e.embedded}
    assert set(emb) == {"gemma-3-270m-Q4_K_M.gguf", "SmolLM2-135M-Instruct.Q4_1.gguf"}
    smol = emb["SmolLM2-135M-Instruct.Q4_1.gguf"]
    assert hashlib.sha256(store.model_path(smol, HubSettings(tmp_path)).read_bytes()).hexdigest() == smol.sha256
    user = tmp_path / "user_models.json"
    gguf_path = tmp_path / FILE
    gguf_path.write_bytes(tiny)
    local = add_local(gguf_path, user)
    assert local.architecture == "llama" and local.context_length == 512
    hub_entry = add_hub(REPO, None, user, list_files=lambda r: [FILE, "README.md"])
    assert hub_entry.filename == FILE and hub_entry.quantization == "Q8_0"
    cat2 = load_catalogue(user)
    assert find_entry(local.id, cat2).local_path == str(gguf_path.resolve())
    assert find_entry(REPO, cat2).id == hub_entry.id
    with pytest.raises(HubError, match="not in the catalogue"):
        find_entry("no-such-model", cat2)
    with pytest.raises(Exception, match="GGUF"):
        add_local(tmp_path / "user_models.json", user)


def test_leftovers_of_a_killed_download_are_not_taken_and_restart_is_clean(hub, settings, tiny):
    """A process killed mid-download leaves a library temp file and maybe a half file in staging."""
    staging = settings.staging_dir / "tiny-q8_0"
    (staging / ".cache" / "huggingface" / "download").mkdir(parents=True)
    (staging / ".cache" / "huggingface" / "download" / f"{FILE}.abc.deadbeef.incomplete").write_bytes(tiny[:1000])
    (staging / FILE).write_bytes(tiny[: len(tiny) // 2])  # half a file under the final name
    assert store.model_path(entry(tiny), settings) is None  # staging never counts as installed
    job = DownloadJob("tiny")
    path = download_model(entry(tiny), settings, job)
    assert path.read_bytes() == tiny and job.state is State.READY
    assert not staging.exists()


def test_a_second_download_of_the_same_model_waits_and_never_touches_the_first(hub, settings, tiny, monkeypatch):
    """Two downloads of one model at once (two windows, the GUI and the CLI): the second waits for the
    first (cancellable while it waits) and then finds the model installed; the first's partial file is
    never deleted or overwritten, and the file is fetched once."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)
    hub.delay_s = 0.02  # ~0.5 s for the whole file
    first, second, third = DownloadJob("first"), DownloadJob("second"), DownloadJob("third")
    started = threading.Event()
    first.on_event = lambda e: started.set() if e.state is State.DOWNLOADING and e.done > len(tiny) // 5 else None
    waiting = {j.label: threading.Event() for j in (second, third)}
    for j in (second, third):
        j.on_event = lambda e: waiting[e.label].set() if getattr(e, "note", "") else None
    results: dict[str, object] = {}

    def run(job):
        try:
            results[job.label] = download_model(entry(tiny), settings, job)
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            results[job.label] = exc

    threads = {j.label: threading.Thread(target=run, args=(j,)) for j in (first, second, third)}
    threads["first"].start()
    assert started.wait(30)
    threads["second"].start()
    threads["third"].start()
    told = waiting["third"].wait(10) and waiting["second"].wait(10)  # why nothing moves
    first_was_downloading = first.state is State.DOWNLOADING
    third.cancel()  # a waiting download stops at once, and leaves the first alone
    for t in threads.values():
        t.join(60)
    path = store.model_path(entry(tiny), settings)
    assert path is not None and results["first"] == results["second"] == path, results
    assert path.read_bytes() == tiny
    assert told and first_was_downloading
    assert isinstance(results["third"], DownloadCancelled) and third.history == [State.QUEUED, State.FAILED]
    assert first.history == [State.QUEUED, State.DOWNLOADING, State.VERIFYING, State.READY]
    assert second.history == [State.QUEUED, State.READY]  # found it installed: no second download
    assert len([p for m, p, _ in hub.requests if m == "GET" and p.endswith(FILE)]) == 1
    assert not (settings.staging_dir / "tiny-q8_0").exists()
