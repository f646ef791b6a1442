"""The chat tab marks a RidgeFill answer once the engine has made its document exact and checked the
answer against exact's: "checked" or "corrected", shown under the answer and kept in the chat file.
The real embedded model in its engine process, a real document shipped in the repo."""
from __future__ import annotations

from importlib.resources import files

import pytest

pytest.importorskip("pytestqt")

from app.conversations import ConversationStore  # noqa: E402
from tests.gui_helpers import attach, make_window, start_service, wait_idle, wait_ready  # noqa: E402


@pytest.fixture
def service(qapp, tmp_path, monkeypatch, model_path):
    monkeypatch.setenv("RIDGEFILL_HOME", str(tmp_path / "home"))
    svc = start_service(model_path, n_ctx=4096, n_batch=512)
    yield svc
    svc.shutdown()


def test_a_ridgefill_answer_ends_checked_or_corrected_once_its_document_is_exact(qtbot, service, tmp_path):
    wait_ready(qtbot, service)
    store = ConversationStore(tmp_path / "chats")
    w = make_window(qtbot, service, max_tokens=16, store=store)
    w.controls.toggle.setChecked(True)
    w.controls.compare.setChecked(False)
    w.controls.mode_box.setCurrentIndex(w.controls.mode_box.findData("speed"))
    w.new_conversation()
    doc = files("backend").joinpath("data", "questions", "realqa-xz-faq-part1.txt")
    assert attach(qtbot, w, str(doc))
    w.chat.input.setPlainText("Which file format does xz use by default?")
    assert w.chat.send()
    wait_idle(qtbot, w)
    answer = w.chat.conv.messages[-1]
    assert answer.timings["mode"] == "speed" and answer.timings["bulk_n"] > 0 and answer.check is None
    shown = answer.content
    qtbot.waitUntil(lambda: answer.check is not None, timeout=300_000)  # refined, then checked, while idle
    widget = w.chat.view.messages[-1]
    if answer.check["verdict"] == "checked":
        assert answer.content == shown and widget.exact.text().startswith("✓ checked against the exact model")
    else:
        assert answer.check["shown_answer"] == shown and answer.content == answer.check["exact_answer"]
        assert widget.text() == answer.content and shown in widget.exact.text()
    assert store.load(w.chat.conv.id).messages[-1].check == answer.check  # kept in the chat file
