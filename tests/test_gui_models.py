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
    from app.paths import data_dir
    from ui.models_panel import USER_MODELS, ModelsPanel

    (data_dir() / USER_MODELS).write_text(json.dumps({"models": [{
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
    assert panel.table.item(row_of(panel, "SmolLM2 135M Instruct"), 4).text() == "embedded"
    r = row_of(panel, "Tiny test model")
    assert panel.table.item(r, 4).text() == "not downloaded"
    assert "disk:" in panel.table.item(r, 5).text()  # the fit hint
    panel.table.selectRow(r)
    assert panel.download_btn.isEnabled() and not panel.use_btn.isEnabled()
    panel.download_btn.click()
    assert panel.cancel_btn.isEnabled() and not panel.progress.isHidden()
    qtbot.waitUntil(lambda: panel.state.text().startswith(("Ready", "Failed")), timeout=30_000)
    assert panel.state.text().startswith("Ready"), panel.state.text()
    assert panel.table.item(r, 4).text() == "installed"
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
    assert panel.table.item(r, 4).text() == "not downloaded"
    assert panel.download_btn.isEnabled()
