"""Switching chats never waits on the disk (issue 65, "saving never blocks the GUI thread"): the shown chat's
latest snapshot goes to the writer thread and the switch goes on; a chat left before its write failed is
kept in memory, told by name, and written once there is room."""
from __future__ import annotations

import errno
import threading

from app.conversations import Conversation, ConversationStore, Message
from app.engine_client import EngineClient
from app.engine_protocol import EngineSettings
from tests.gui_helpers import make_window


def test_switching_does_not_wait_for_a_slow_write_and_a_left_chat_whose_write_fails_is_kept(
        qtbot, tmp_path, model_path, monkeypatch):
    store = ConversationStore(tmp_path / "chats")
    service = EngineClient(EngineSettings(model_path=model_path))  # never started: no question is asked
    w = make_window(qtbot, service, store=store)
    chat = w.chat
    gate, real_write = threading.Event(), store.write

    def slow_then_full(snap):  # the writer thread's write: a disk that takes its time, then is full
        gate.wait(30)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store, "write", slow_then_full)
    left = chat.conv
    left.title = "Kept across the switch"
    left.messages.append(Message("user", "What does the left chat hold?"))
    chat.save()
    assert store.pending()
    assert chat.load_conversation(Conversation())  # switched while the write is still out...
    assert store.pending() and chat.conv is not left  # ...without waiting for it
    gate.set()
    qtbot.waitUntil(lambda: "Kept across the switch" in chat.notice.text(), timeout=10_000)
    assert "could not be saved" in chat.notice.text() and "No space left on device" in chat.notice.text()
    assert not (tmp_path / "chats" / f"{left.id}.json").exists()
    assert not chat.save_now()  # quitting now would be asked about: a chat is not on disk

    monkeypatch.setattr(store, "write", real_write)  # room again: the retry writes the left chat
    qtbot.waitUntil(lambda: (tmp_path / "chats" / f"{left.id}.json").exists(), timeout=15_000)
    assert [m.content for m in store.load(left.id).messages] == ["What does the left chat hold?"]
    qtbot.waitUntil(lambda: not chat.notice.isVisibleTo(w), timeout=5_000)
    assert chat.save_now()
