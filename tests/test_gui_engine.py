"""The engine process: a killed engine is reported and replaced while the chat stays; a bad model is
reported once; the RidgeFill controls reach the engine (the mode and split it reports in its timings)
and show the model's own defaults before the engine has loaded; the engine side has no Qt."""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

pytest.importorskip("pytestqt")

from backend.corpus import corpus_texts  # noqa: E402
from backend.embedded_models import embedded_model_path  # noqa: E402
from app.conversations import Document  # noqa: E402
from tests.gui_helpers import make_window, start_service, wait_idle, wait_ready  # noqa: E402


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("RIDGEFILL_HOME", str(tmp_path))
    return tmp_path


def test_killed_engine_is_reported_and_replaced_while_the_chat_stays(qtbot, home, model_path):
    service = start_service(model_path, n_ctx=1024)
    try:
        wait_ready(qtbot, service)
        w = make_window(qtbot, service)
        w.controls.toggle.setChecked(False)
        w.chat.input.setPlainText("Say hello.")
        w.chat.send()
        wait_idle(qtbot, w)
        first_answer = w.chat.conv.messages[-1].content
        old_pid = service.pid
        crashes = []
        service.crashed.connect(crashes.append)

        w.chat.input.setPlainText("Tell me a long story about the sea.")
        w.chat.max_tokens = 200
        w.chat.send()
        qtbot.waitUntil(lambda: len(w.chat.conv.messages[-1].content) > 0, timeout=60_000)
        os.kill(old_pid, signal.SIGKILL)  # as a segfault inside llama.cpp would
        qtbot.waitUntil(lambda: bool(crashes), timeout=10_000)
        assert "stopped unexpectedly" in crashes[0] and "SIGKILL" in crashes[0]
        assert "stopped unexpectedly" in w.engine_label.text() or "Engine ready" in w.engine_label.text()
        assert w.chat.notice.isVisible() and "conversation is kept" in w.chat.notice.text()
        wait_idle(qtbot, w, 10)
        interrupted = w.chat.conv.messages[-1]
        assert "stopped unexpectedly" in interrupted.note and interrupted.content  # partial answer kept
        assert [m.content for m in w.chat.conv.messages[:2]] == ["Say hello.", first_answer]
        assert len(w.chat.view.messages) == 4

        qtbot.waitUntil(lambda: service.info is not None and service.pid != old_pid, timeout=90_000)
        qtbot.waitUntil(lambda: "Engine ready" in w.engine_label.text(), timeout=5_000)
        assert ("for trying the app" in w.engine_label.text()) == (
            Path(model_path).resolve() == embedded_model_path().resolve())
        w.chat.max_tokens = 8
        w.chat.input.setPlainText("Say hello again.")
        assert w.chat.send()
        wait_idle(qtbot, w)
        assert w.chat.conv.messages[-1].content.strip() and w.chat.conv.messages[-1].complete
        # saved on disk too, with the interrupted answer marked
        saved = w.store.load(w.chat.conv.id)
        assert len(saved.messages) == 6 and "stopped unexpectedly" in saved.messages[3].note
    finally:
        service.shutdown()
    assert service.pid is None


@pytest.mark.slow
def test_toggle_and_slider_set_the_mode_and_split_the_engine_reports(qtbot, home, model_path):
    """Speed mode on the maps shipped in maps_cache/ (split 21), then the toggle off."""
    from backend.ridgefill import defaults

    service = start_service(model_path, n_ctx=2048, n_batch=256)
    try:
        wait_ready(qtbot, service)
        w = make_window(qtbot, service, max_tokens=4)
        w.controls.compare.setChecked(False)
        text = "\n\n".join(corpus_texts())[:7200]  # ~1,700 tokens: more than MIN_BULK + the tail
        w.chat.conv.document = Document("doc.txt", text)
        w.controls.toggle.setChecked(True)
        w.controls.mode_box.setCurrentIndex(w.controls.mode_box.findData("speed"))
        w.controls.slider.setValue(21)
        w.controls.tail_spin.setValue(defaults.MIN_TAIL)
        assert w.controls.split_label.text().startswith("S = 21: layers 21–29 predicted")
        qtbot.waitUntil(lambda: w.maps_tasks.check_task is None and "split 21" in w.controls.maps_label.text(), timeout=60_000)
        assert w.controls.maps_status in ("verified", "warning"), w.controls.maps_reasons.text()
        w.chat.input.setPlainText("What is the harbour called?")
        w.chat.send()
        wait_idle(qtbot, w, 300)
        t = w.chat.conv.messages[-1].timings
        assert t is not None, w.chat.conv.messages[-1].note
        assert t["mode"] == "speed", t["note"]
        assert t["split"] == 21 and t["tail"] == defaults.MIN_TAIL and t["bulk_n"] > 1000
        assert "speed S=21" in w.chat.view.messages[-1].meta.text()

        w.new_conversation()
        w.controls.toggle.setChecked(False)
        w.chat.input.setPlainText("Say hi.")
        w.chat.send()
        wait_idle(qtbot, w, 120)
        t2 = w.chat.conv.messages[-1].timings
        assert t2["mode"] == "off" and t2["split"] is None and t2["bulk_n"] == 0
    finally:
        service.shutdown()


def test_a_bad_model_file_is_reported_once_and_not_restarted(qtbot, home, tmp_path):
    from app.engine_client import EngineClient
    from app.engine_protocol import EngineSettings, TaskKind

    bad = tmp_path / "notes.gguf"
    bad.write_text("not a model", encoding="utf-8")
    service = EngineClient(EngineSettings(model_path=str(bad)))
    fatal, crashed = [], []
    service.fatal.connect(fatal.append)
    service.crashed.connect(crashed.append)
    service.start()
    try:
        failed = []
        task = service.submit(TaskKind.PING, on_failed=lambda et, msg: failed.append((task.id, et, msg)))
        tid = task.id
        qtbot.waitUntil(lambda: bool(fatal), timeout=60_000)
        assert "not a GGUF model" in fatal[0]
        qtbot.waitUntil(lambda: bool(failed), timeout=5_000)
        assert failed[0][0] == tid and failed[0][1] == "ModelFileError"
        qtbot.wait(300)
        assert not crashed and service.info is None  # no restart loop on a file that cannot load
    finally:
        service.shutdown()


def test_the_engine_process_and_its_protocol_import_no_qt():
    """The child and the handle a local server will use must not pull in PySide6."""
    import subprocess
    import sys

    code = ("import sys, app.engine_child, app.engine_process, app.engine_protocol, app.job_runner, backend.model_file; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('PySide6', 'shiboken6', 'ui')); "
            "print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_controls_show_the_models_defaults_from_the_first_frame(qtbot, home, model_path, tmp_path):
    """Before the engine has loaded anything, the split slider spans the model's layers and shows its
    default split and tail (backend/ridgefill/defaults.py), not numbers of the GUI's own."""
    from app.engine_client import EngineClient
    from app.engine_protocol import EngineSettings
    from backend.model_file import read_model_info
    from backend.protocol import RIDGEFILL_MODES
    from backend.ridgefill import defaults

    info = read_model_info(model_path)
    service = EngineClient(EngineSettings(model_path=model_path))  # never started
    w = make_window(qtbot, service)
    assert service.pid is None and service.info is None
    c = w.controls
    assert c.slider.maximum() == info.n_layer - 1
    assert c.split() == defaults.default_split(info) and c.tail() == defaults.default_tail(info)
    assert c.split_label.text().startswith(f"S = {c.split()}: ")
    assert [c.mode_box.itemData(i) for i in range(c.mode_box.count())] == list(RIDGEFILL_MODES)
    # SmolLM2 runs exact by default (measured, defaults.MEASURED_MODES): RidgeFill is shown switched off, its
    # mode one click away
    assert defaults.default_mode(info) == "off" and c.mode() == "off" and c.mode_box.currentData() == "guided"
    # a model the table does not name runs guided, RidgeFill switched on again; a sliding-window one with its
    # window as the tail (its windows are kept)
    from tests.tiny_gguf import write_tiny_gguf

    gemma = read_model_info(write_tiny_gguf(tmp_path / "gemma3.gguf", "gemma3"))
    assert w.show_model(str(gemma.path))
    assert c.mode() == "guided" and c.tail() == defaults.default_tail(gemma)
    assert w.show_model(model_path) and c.mode() == "off"
    # a server's model shown meanwhile gives the local one back as it was: off by default, or as the user set it
    c.show_remote(24, 16, 64)
    c.show_local()
    assert c.mode() == "off" and c.exact_by_default
    c.toggle.setChecked(True)
    c.show_remote(24, 16, 64)
    c.show_local()
    assert c.mode() == "guided"


def test_the_first_start_opens_on_the_models_the_app_recommends(qtbot, home, model_path):
    """With no settings file yet the window opens on Models & maps (the embedded models are for trying
    the app); once settings were saved it opens on the chat. Attaching a document brings the chat forward."""
    from app.engine_client import EngineClient
    from app.engine_protocol import EngineSettings

    service = EngineClient(EngineSettings(model_path=model_path))  # started by the count that attaching asks
    try:
        check_the_first_start(qtbot, home, service)
    finally:
        service.shutdown()


def check_the_first_start(qtbot, home, service):
    from app.conversations import ConversationStore
    from app.settings import Settings
    from ui.main_window import MainWindow

    for first in (True, False):
        settings = Settings.load()
        assert settings.first_start is first
        w = MainWindow(settings, service, ConversationStore(), owns_service=False)
        qtbot.addWidget(w)
        assert (w.tabs.currentWidget() is w.models) is first
        settings.save()
    doc = home / "notes.txt"
    doc.write_text("The daily limit is 500 requests.")
    w.tabs.setCurrentWidget(w.models)
    w.chat.attach_document(doc)  # from the File menu while Models & maps is shown: the chat comes forward
    qtbot.waitUntil(lambda: w.tabs.currentWidget() is w.chat, timeout=10_000)
