"""The recall panel on a short run: both heatmaps fill, per-region accuracy and McNemar p shown, export."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("pytestqt")

from tests.gui_helpers import make_window, start_service, wait_ready  # noqa: E402


@pytest.fixture(scope="module")
def service(qapp, tmp_path_factory, model_path):
    mp = pytest.MonkeyPatch()
    mp.setenv("RIDGEFILL_HOME", str(tmp_path_factory.mktemp("rfhome")))
    svc = start_service(model_path, n_ctx=2048, n_batch=256)
    yield svc
    svc.shutdown()
    mp.undo()


@pytest.fixture
def window(qtbot, service):
    wait_ready(qtbot, service)
    return make_window(qtbot, service)


@pytest.mark.slow
def test_recall_panel_fills_its_heatmaps_on_a_short_run(qtbot, window, tmp_path):
    panel = window.recall
    assert panel is not None, "the recall tab is missing"
    window.controls.toggle.setChecked(True)
    panel.lengths.setText("256, 640")
    panel.depths.setText("0.2, 0.8")
    panel.haystack.setCurrentIndex(panel.haystack.findData("corpus"))
    assert panel.run()
    assert not panel.run_btn.isEnabled() and panel.cancel_btn.isEnabled()
    qtbot.waitUntil(lambda: panel._task is None, timeout=240_000)
    assert panel.result is not None, panel.status.text()
    assert panel.exact_map.filled() == 4 and panel.rf_map.filled() == 4
    for L in (256, 640):
        for d in (0.2, 0.8):
            assert panel.exact_map.accuracy(L, d) is not None and panel.rf_map.accuracy(L, d) is not None
    assert "McNemar" in panel.summary.text() and "p = " in panel.summary.text()
    assert "bulk" in panel.summary.text() and "tail" in panel.summary.text()
    regions = {r["region"] for r in panel.rows}
    assert regions <= {"bulk", "tail"} and "tail" in regions
    out = panel.export(tmp_path / "recall.json")
    data = json.loads(out.read_text())
    assert len(data["rows"]) == 8 and data["complete"] and data["summary"]["paired"]["n"] == 4
    img = panel.grab()
    assert not img.isNull()


def test_recall_panel_cancel_keeps_the_cells_done(qtbot, window):
    panel = window.recall
    panel.lengths.setText("256")
    panel.depths.setText("0.1, 0.3, 0.5, 0.7, 0.9")
    panel.haystack.setCurrentIndex(panel.haystack.findData("filler"))
    assert panel.run()
    qtbot.waitUntil(lambda: len(panel.rows) >= 1, timeout=120_000)
    panel.cancel_btn.click()
    qtbot.waitUntil(lambda: panel._task is None, timeout=60_000)
    assert "Cancelled" in panel.status.text()
    assert 1 <= len(panel.rows) < 10 and panel.result is None
    assert panel.export_btn.isEnabled() and panel.run_btn.isEnabled()
