"""A full disk while a chat is saved (issue 55, item 1): the user is told, the buttons come back, the chat
stays in the window and is written once there is room, and quitting still stops the server and the engine."""
from __future__ import annotations

import errno

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtWidgets import QMessageBox  # noqa: E402

from app.conversations import ConversationStore  # noqa: E402
from tests.gui_helpers import make_window, start_service, wait_idle, wait_ready  # noqa: E402


@pytest.fixture(scope="module")
def service(qapp, model_path):
    svc = start_service(model_path, n_ctx=2048, n_batch=128)
    yield svc
    svc.shutdown()


def test_a_full_disk_during_an_answer_is_told_keeps_the_chat_and_saves_it_when_there_is_room(
        qtbot, service, tmp_path, monkeypatch):
    wait_ready(qtbot, service)
    store = ConversationStore(tmp_path / "chats")
    w = make_window(qtbot, service, store=store)
    w.controls.toggle.setChecked(False)
    w.controls.compare.setChecked(False)
    w.new_conversation()
    tries = []

    def full(snap):  # the writer thread's write (saves are written off the GUI thread)
        tries.append(snap.id)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store, "write", full)
    w.chat.input.setPlainText("Name three colours.")
    assert w.chat.send()
    wait_idle(qtbot, w)

    chat = w.chat
    qtbot.waitUntil(lambda: bool(chat.save_error) and not store.pending())  # the write's news comes back
    assert chat.notice.isVisibleTo(w) and "could not be saved" in chat.notice.text()
    assert "No space left on device" in chat.notice.text() and "free some disk space" in chat.notice.text()
    assert chat.send_btn.isEnabled() and chat.attach_btn.isEnabled()
    assert not chat.stop_btn.isEnabled() and not chat.busy()
    answer = chat.conv.messages[-1]
    assert answer.role == "assistant" and answer.complete and answer.content.strip()
    assert len(tries) < 20, "a failed write is not tried again on every token"
    assert not list((tmp_path / "chats").glob("*.json"))

    monkeypatch.undo()  # room again: the retry writes the chat without a new message
    qtbot.waitUntil(lambda: (tmp_path / "chats" / f"{chat.conv.id}.json").exists(), timeout=15000)
    saved = store.load(chat.conv.id)
    assert [m.content for m in saved.messages] == [m.content for m in chat.conv.messages]
    # the write's news reaches the window a moment after the file (ui/chat_saving.py takes it in)
    qtbot.waitUntil(lambda: not chat.notice.isVisibleTo(w) and chat.save_error == "", timeout=5000)

    stopped, asked = [], []
    monkeypatch.setattr(store, "write", full)
    monkeypatch.setattr(w.serve, "stop", lambda: stopped.append(True))
    chat.conv.messages[-1].content += " (edited)"
    assert not chat.save_now()
    monkeypatch.setattr(QMessageBox, "warning", lambda *a: asked.append(a[2]) or QMessageBox.No)
    assert not w.close() and w.isVisible() and "could not be saved" in asked[0]  # quitting would lose it: asked
    w.shutdown()  # quitting anyway: a failed write raises nothing and skips nothing
    assert stopped == [True] and chat.save_error
    monkeypatch.undo()
    assert chat.save_now() and "(edited)" in store.load(chat.conv.id).messages[-1].content
