"""The models & maps panel: HUB's catalogue, a download from a local stand-in hub with progress, cancel."""
from __future__ import annotations

import hashlib
import json

import pytest

pytest.importorskip("pytestqt")

from app.engine_client import EngineClient  # noqa: E402
from app.engine_protocol import EngineSettings  # noqa: E402
from app.settings import Settings  # noqa: E402
from tests.hub_server import FakeHub  # noqa: E402
from tests.test_hub_downloads import FILE, REPO, write_tiny_gguf  # noqa: E402


@pytest.fixture
def tiny(tmp_path):
    return write_tiny_gguf(tmp_path / FILE)


@pytest.fixture
def panel(qtbot, tmp_path, monkeypatch, tiny, model_path):
    monkeypatch.setenv("RIDGEFILL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    hub = FakeHub().start()
    hub.add_file(REPO, FILE, tiny)
    from backend.hub.catalogue import user_models_file
    from ui.models_panel import ModelsPanel

    user_models_file().write_text(json.dumps({"models": [{
        "id": "tiny-q8_0", "name": "Tiny test model", "architecture": "llama", "repo_id": REPO,
        "filename": FILE, "quantization": "Q8_0", "size_bytes": len(tiny), "size_exact": True,
        "sha256": hashlib.sha256(tiny).hexdigest()}]}), encoding="utf-8")
    service = EngineClient(EngineSettings(model_path))  # not started: the panel only reads its info
    p = ModelsPanel(service, Settings(hub_endpoint=hub.url))
    qtbot.addWidget(p)
    qtbot.waitUntil(lambda: not p.refreshing(), timeout=20_000)  # the catalogue is read in the background
    p.hub = hub
    yield p
    p.shutdown()
    hub.stop()


def row_of(panel, name):
    return next(r for r, e in enumerate(panel.entries) if e.name == name)


def test_catalogue_lists_the_embedded_model_and_downloads_with_progress(qtbot, panel, tiny):
    names = [e.name for e in panel.entries]
    assert "SmolLM2 135M Instruct" in names and "Tiny test model" in names
    assert panel.table.item(row_of(panel, "SmolLM2 135M Instruct"), 5).text() == "embedded"
    r = row_of(panel, "Tiny test model")
    assert panel.table.item(r, 5).text() == "not downloaded"
    assert "disk:" in panel.table.item(r, 6).text()  # the fit hint
    assert panel.table.item(row_of(panel, "SmolLM2 135M Instruct"), 4).text() == "8K"  # its context
    panel.table.selectRow(r)
    assert panel.download_btn.isEnabled() and not panel.use_btn.isEnabled()
    panel.download_btn.click()
    assert panel.cancel_btn.isEnabled() and not panel.progress.isHidden()
    qtbot.waitUntil(lambda: panel.state.text().startswith(("Ready", "Failed")), timeout=30_000)
    assert panel.state.text().startswith("Ready"), panel.state.text()
    assert panel.table.item(r, 5).text() == "installed"
    panel.table.selectRow(r)
    assert panel.use_btn.isEnabled()
    opened = []
    panel.open_model.connect(opened.append)
    panel.use_btn.click()
    assert opened and opened[0].endswith(FILE)
    assert not panel._job.running()


def test_cancel_stops_a_download_and_installs_nothing(qtbot, panel):
    panel.hub.delay_s = 0.05  # slow the stand-in hub so there is time to cancel
    r = row_of(panel, "Tiny test model")
    panel.table.selectRow(r)
    panel.download_btn.click()
    qtbot.waitUntil(lambda: "downloading" in panel.state.text(), timeout=20_000)
    panel.cancel_btn.click()
    qtbot.waitUntil(lambda: panel.state.text().startswith(("Failed", "Ready")), timeout=20_000)
    assert panel.state.text().startswith("Failed") and "cancel" in panel.state.text()
    assert panel.table.item(r, 5).text() == "not downloaded"
    assert panel.download_btn.isEnabled()


def tiny_map_set(model, maps_dir):
    """A valid (random) map set at split 0 for a tiny GGUF of write_tiny_gguf (2 layers of width 64)."""
    import torch

    from backend.model_file import read_model_info
    from backend.ridgefill.fingerprint import model_fingerprint
    from backend.ridgefill.map_format import write_map_folder

    info = read_model_info(model)
    n, d, layers = info.n_layer, info.n_embd, list(range(1, info.n_layer))
    return write_map_folder(
        maps_dir / "second-test-model-s00", split=0, n_layer=n,
        weights={l: torch.eye(d) for l in layers}, biases={l: torch.zeros(d) for l in layers},
        fingerprint=model_fingerprint(model, layers=list(range(0, n))), lambdas={l: 0.01 for l in layers},
        heldout_cosine={l: 0.5 for l in layers}, calibration={"note": "random maps for the panel test"})


def map_blocks(text: str) -> dict[str, str]:
    """The panel's map listing, model title -> its indented lines."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("  "):
            out[title] += line + "\n"
        else:
            title = line
            out[title] = ""
    return out


def test_map_sets_of_every_installed_model_are_listed(qtbot, panel, tmp_path, model_path):
    """Not only the current model's: a second installed model's map set is listed too, in its own block."""
    from types import SimpleNamespace

    second = tmp_path / "second.gguf"
    write_tiny_gguf(second, n_floats=1000, name="second test model")
    folder = tiny_map_set(second, panel.hub_settings().maps_dir)
    panel.add_local(str(second))  # "Open local GGUF…": added to the catalogue, then the maps are listed again
    qtbot.waitUntil(lambda: not panel.refreshing() and "second test model" in panel.maps.text(), timeout=60_000)
    blocks = map_blocks(panel.maps.text())
    # No engine yet, so no current model: every installed model is listed, each with its own sets.
    assert list(blocks) == ["SmolLM2 135M Instruct", "second test model"], blocks  # "Tiny" is not downloaded
    smol = blocks["SmolLM2 135M Instruct"]
    assert "  split 12: verified — " in smol and "maps_cache" in smol  # the shipped sets
    assert blocks["second test model"] == f"  split 0: verified — {folder}\n"  # only its own set
    # With the embedded model running, it comes first and is marked; the second model is still listed.
    panel.service = SimpleNamespace(info=SimpleNamespace(model_path=model_path, default_split=12))
    panel.refresh()
    qtbot.waitUntil(lambda: not panel.refreshing() and "current model" in panel.maps.text(), timeout=60_000)
    blocks = map_blocks(panel.maps.text())
    assert list(blocks) == ["SmolLM2 135M Instruct — current model", "second test model"], blocks
    assert "fit-maps --split 12" in blocks["SmolLM2 135M Instruct — current model"]
    assert blocks["second test model"] == f"  split 0: verified — {folder}\n"


def test_a_new_cache_location_or_hub_restarts_the_engine_and_an_emptied_one_gives_the_default_back(
        qtbot, tmp_path, monkeypatch):
    """The engine process takes the cache location (maps, tuned splits, activations) and the hub as typed
    settings when it starts, so changing them restarts it; answer room alone does not. The environment
    stays the user's: an emptied setting gives back what the app was started with."""
    import os

    from backend import user_paths
    from ui.settings_dialog import SettingsDialog

    for name in ("RIDGEFILL_CACHE_DIR", "HF_ENDPOINT"):  # restored after the test
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_TOKEN", "from-the-shell")
    s = Settings()
    dlg = SettingsDialog(s)
    qtbot.addWidget(dlg)
    dlg.max_tokens.setValue(s.max_tokens + 64)
    assert dlg.apply() is False
    dlg.cache.setText(str(tmp_path / "elsewhere"))
    dlg.token.setText("typed-in")
    assert dlg.apply() is True and s.cache_location == str(tmp_path / "elsewhere")
    hub = s.hub_settings()
    assert s.engine_settings().cache_root == str(tmp_path / "elsewhere") == str(hub.cache_root)
    assert hub.token == "typed-in"
    dlg.cache.setText("")
    dlg.token.setText("")
    assert dlg.apply() is True
    hub = s.hub_settings()
    assert s.engine_settings().cache_root is None and hub.cache_root == user_paths.cache_dir()
    assert hub.token == "from-the-shell"
    assert "RIDGEFILL_CACHE_DIR" not in os.environ and os.environ["HF_TOKEN"] == "from-the-shell"  # untouched


def test_the_recommended_model_is_offered_and_downloads_in_one_click(qtbot, panel, tiny, monkeypatch):
    """The embedded models are for trying the app: the panel offers the catalogue's model for documents
    that fits this machine (here the budget is cut to the tiny file's size, so it is the one that fits)."""
    from backend.hub import recommend
    from backend.hub.catalogue import user_models_file

    monkeypatch.setattr(recommend, "MB_PER_CORE", 2 * len(tiny) / 1e6)
    monkeypatch.setattr("ui.models_panel.recommended_model",
                        lambda entries, rows: recommend.recommended_model(entries, rows, cores=1))
    panel.refresh()
    qtbot.waitUntil(lambda: not panel.refreshing(), timeout=20_000)
    assert panel.recommend_btn.isHidden()  # the tiny model is not an instruct model with a long context
    user_models_file().write_text(json.dumps({"models": [{
        "id": "tiny-it-q8_0", "name": "Tiny Instruct", "architecture": "llama", "repo_id": REPO,
        "filename": FILE, "quantization": "Q8_0", "size_bytes": len(tiny), "size_exact": True,
        "context_length": 32768, "sha256": hashlib.sha256(tiny).hexdigest()}]}), encoding="utf-8")
    panel.refresh()
    qtbot.waitUntil(lambda: not panel.refreshing(), timeout=20_000)
    assert not panel.recommend_btn.isHidden() and panel.recommend_btn.text() == "Download Tiny Instruct"
    assert "for trying the app" in panel.recommend_line.text()
    panel.recommend_btn.click()
    qtbot.waitUntil(lambda: panel.state.text().startswith(("Ready", "Failed")), timeout=30_000)
    assert panel.state.text().startswith("Ready"), panel.state.text()
    assert panel.table.item(row_of(panel, "Tiny Instruct"), 5).text() == "installed"
    assert panel.recommend_btn.isHidden()  # installed: nothing left to offer
