"""The prompt cache in the GUI: the status bar shows the document's share made exact, then "exact, saving"
until it is on disk, then "exact";
Settings sets the cache's size (a restart: the engine reads it when it starts) and clears it."""
from __future__ import annotations

from PySide6.QtCore import Qt

from app.engine_client import EngineClient
from app.engine_protocol import DocumentState, EngineSettings
from app.settings import Settings
from backend.idle_work import DocumentStatus
from gui_helpers import make_window


def test_the_status_bar_shows_the_document_made_exact(qtbot, model_path):
    service = EngineClient(EngineSettings(model_path))  # never started: its messages are delivered by hand
    w = make_window(qtbot, service)
    qtbot.addWidget(w)
    service._deliver(DocumentState(DocumentStatus(tokens=4110, exact_rows=2548, refining=True, cache_limit=4 * 10**9)))
    assert w.document_label.text() == "document 4,110 tokens, 62% exact"
    assert "of 4 GB" in w.document_label.toolTip()
    service._deliver(DocumentState(DocumentStatus(tokens=4110, exact_rows=4110, saving=True, cache_limit=4 * 10**9)))
    assert w.document_label.text() == "document 4,110 tokens, exact, saving"  # not yet on disk
    service._deliver(DocumentState(DocumentStatus(tokens=4110, exact_rows=4110, saved=True, cache_limit=4 * 10**9)))
    assert w.document_label.text() == "document 4,110 tokens, exact"
    engine = w.settings.engine_settings()
    assert engine.cache_limit_bytes == 4 * 10**9 and engine.prompt_cache
    service.shutdown()  # in case the window asked it something (which starts it)


def test_settings_set_the_prompt_cache_size_and_clear_it(qtbot):
    from ui.settings_dialog import SettingsDialog

    s = Settings()
    cleared = []
    dlg = SettingsDialog(s, clear_cache=lambda: cleared.append(True))
    qtbot.addWidget(dlg)
    assert dlg.prompt_cache.value() == 4
    dlg.prompt_cache.setValue(1)
    assert dlg.apply() is True and s.prompt_cache_bytes() == 10**9  # the engine takes it when it restarts
    qtbot.mouseClick(dlg.clear_cache, Qt.LeftButton)
    assert cleared == [True]
    dlg.prompt_cache.setValue(0)
    assert dlg.apply() is True and s.prompt_cache_gb == 0 and dlg.prompt_cache.text() == "off"
    assert not SettingsDialog(Settings(), clear_cache=None).clear_cache.isEnabled()
