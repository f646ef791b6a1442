"""A model, thread count or context size given on the command line is for this run only: the engine gets
it, the saved settings never do (they were saved as the user's choice at the next save before)."""
from __future__ import annotations

import json
from types import SimpleNamespace

from app.settings import RunOverrides, Settings
from backend.protocol import AUTO_CTX


def test_command_line_overrides_reach_the_engine_and_are_not_saved(qtbot, tmp_path, model_path):
    from app.gui import build_window

    Settings(model_path=None, threads=0).save()  # the user's own: the embedded model, every core
    window = build_window(SimpleNamespace(model=model_path, threads=1, ctx=1024))
    try:
        engine = window.service.settings
        assert engine.model_path == model_path and engine.n_threads == 1 and engine.n_ctx == 1024
        window.settings.save()  # as the window does on close and on every settings change
        saved = json.loads(Settings.path().read_text())
        assert not saved.get("model_path") and not saved["threads"] and saved["n_ctx"] == AUTO_CTX  # None: not written
        engine = window.overrides.apply(window.settings.engine_settings())  # what a restart is built from
        assert engine.model_path == model_path and engine.n_threads == 1 and engine.n_ctx == 1024
    finally:
        window.shutdown()


def test_no_override_leaves_the_settings_as_they_are():
    base = Settings(model_path="chosen.gguf", threads=3).engine_settings()
    assert RunOverrides().apply(base) == base
    assert RunOverrides("other.gguf").apply(base).model_path == "other.gguf"
    assert RunOverrides(n_ctx=AUTO_CTX).apply(base) == base  # --ctx left at its default keeps the saved size
    assert RunOverrides(n_ctx=2048).apply(base).n_ctx == 2048
