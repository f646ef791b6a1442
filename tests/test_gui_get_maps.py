"""The RidgeFill panel's "Get maps" button, driven on a tiny model: nothing published, so the engine
captures (a small budget) and fits; the panel then shows the set verified, and so does the models tab."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from tests.gui_helpers import make_window, start_service, wait_ready  # noqa: E402
from tests.tiny_gguf import write_tiny_gguf  # noqa: E402


def test_get_maps_button_fits_and_the_panel_shows_the_set_verified(qtbot, tmp_path):
    tiny = str(write_tiny_gguf(tmp_path / "tiny-llama.gguf", "llama", n_layer=4))
    service = start_service(tiny, n_ctx=512)
    w = None
    try:
        wait_ready(qtbot, service, timeout_s=120)
        w = make_window(qtbot, service, model_path=tiny, auto_tune_off=["tiny-llama.gguf"])  # maps only, no tune after
        w.maps_tasks.capture_tokens = 600  # a small first capture: seconds on a tiny model
        c = w.controls
        c.slider.setValue(2)
        qtbot.waitUntil(lambda: getattr(c, "maps_status", None) == "missing" and "split 2" in c.maps_label.text(),
                        timeout=60_000)
        assert c.get_btn.text() == "Get maps" and c.get_btn.isEnabled()
        events = []
        w.service.submit = _spy(w.service.submit, events)
        c.get_btn.click()
        assert not c.get_btn.isEnabled() and not c.fit_bar.isHidden()  # busy: progress shown, no second click
        qtbot.waitUntil(lambda: c.maps_status == "verified", timeout=120_000)
        assert "Maps verified" in c.maps_label.text() and "split 2" in c.maps_label.text()
        assert c.fit_bar.isHidden() and not c.get_btn.isEnabled()  # nothing left to get for this split
        assert "fitted, verified" in w.engine_label.text()
        assert "GET_MAPS" in events and "ProgressEvent" in events and "StageNote" in events  # progress, notes
        qtbot.waitUntil(lambda: "split 2: verified" in w.models.maps.text(), timeout=60_000)
    finally:
        if w is not None:
            w.shutdown()
        service.shutdown()


def _spy(submit, events):
    def wrapped(kind, payload, **kw):
        events.append(kind.name)
        on_event = kw.get("on_event")
        if on_event is not None:
            kw["on_event"] = lambda ev: (events.append(type(ev).__name__), on_event(ev))
        return submit(kind, payload, **kw)

    return wrapped
