"""A document's side file (documents/<key>.txt) is removed once no saved chat names it (issue 65): by the
store's writer thread, under the chat folder's lock, so a side file another process's chat names is kept,
and one removed between another store's side-file write and its chat write is written again."""
from __future__ import annotations

import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

import app.conversations as conversations
from app.conversations import Conversation, ConversationStore, Document, Message

ROOT = Path(__file__).resolve().parents[1]


def chat(conv_id: str, *docs: Document) -> Conversation:
    return Conversation(id=conv_id, documents=list(docs), messages=[Message("user", "q")])


def side(store: ConversationStore, doc: Document) -> Path:
    return store.documents / doc.text_file


@pytest.fixture
def removals(monkeypatch):
    """The threads that removed side files, and what they removed (store.save removes on its caller's)."""
    seen: list[tuple[threading.Thread, list[str]]] = []
    real = conversations.remove_unnamed

    def recorded(*args):
        removed = real(*args)
        if removed:
            seen.append((threading.current_thread(), removed))
        return removed
    monkeypatch.setattr(conversations, "remove_unnamed", recorded)
    return seen


def test_a_removed_documents_side_file_goes_once_no_chat_names_it(tmp_path, removals):
    store = ConversationStore(tmp_path)
    a = chat("a", Document("x.txt", "X text."), Document("y.txt", "Y text."))
    store.save(a)
    x, y = a.documents
    store.save(chat("b", replace(x)))  # another chat naming x's side file (a chat saved as a copy does)
    a.documents.remove(x)
    store.save(a)
    assert side(store, x).exists(), "a side file another chat names was removed"
    a.documents.remove(y)
    store.save(a)
    assert not side(store, y).exists(), "the side file of a removed document is still there"
    assert store.load("a").documents == [] and store.load("b").documents[0].text == "X text."


def test_deleting_a_chat_removes_its_side_files_on_the_writer_thread(tmp_path, removals):
    store = ConversationStore(tmp_path)
    a, b = chat("a", Document("x.txt", "X text.")), chat("b", Document("y.txt", "Y text."))
    store.save(a)
    store.save(b)
    told = []
    store.delete_later("a", lambda conv_id, removed, error: told.append((conv_id, removed, error)))
    assert store.flush(timeout=10)
    assert not store.file_of("a").exists() and not side(store, a.documents[0]).exists()
    assert told == [("a", [a.documents[0].text_file], None)]
    assert side(store, b.documents[0]).exists() and [s.id for s in store.summaries()] == ["b"]
    assert removals and all(t is not threading.main_thread() for t, _ in removals)


def test_a_cleanup_removes_only_side_files_no_chat_names_a_set_aside_one_included(tmp_path, removals):
    store = ConversationStore(tmp_path)
    kept, damaged = chat("a", Document("x.txt", "X text.")), chat("d", Document("z.txt", "Z text."))
    store.save(kept)
    store.save(damaged)
    raw = store.file_of("d").read_bytes()
    store.file_of("d").write_bytes(raw[:-2])  # damaged: set aside by the next read, its document kept for it
    assert [s.id for s in store.summaries()] == ["a"]
    stray = store.documents / ("0" * 32 + ".txt")
    stray.write_text("a chat deleted by hand named this")
    store.remove_unused_later()
    assert store.flush(timeout=10)
    assert not stray.exists()
    assert side(store, kept.documents[0]).exists() and side(store, damaged.documents[0]).exists()
    assert removals and all(t is not threading.main_thread() for t, _ in removals)


def test_a_side_file_removed_before_another_stores_chat_is_written_is_written_again(tmp_path, monkeypatch):
    store, other = ConversationStore(tmp_path), ConversationStore(tmp_path)  # two processes' stores
    conv = chat("c", Document("x.txt", "X text."))
    removed, real_lock = [], other._lock

    def cleanup_first():  # another store's cleanup runs after the side file is written, before the chat is
        removed.extend(store._remove_unused())
        return real_lock()
    monkeypatch.setattr(other, "_lock", cleanup_first)
    other.save(conv)
    assert removed == [conv.documents[0].text_file], "the cleanup did not run between the two writes"
    assert ConversationStore(tmp_path).load("c").documents[0].text == "X text."


CHILD = """
import sys
from app.conversations import Conversation, ConversationStore, Document, Message
store = ConversationStore(sys.argv[1])
if sys.argv[2] == "save":
    store.save(Conversation(id="theirs", messages=[Message("user", "q")],
                            documents=[Document("x.txt", "X text.", text_file=sys.argv[3])]))
else:
    store.delete_later("theirs")
    assert store.flush(timeout=30)
"""


def test_a_side_file_another_processs_chat_names_is_kept_until_that_chat_goes(tmp_path):
    store = ConversationStore(tmp_path)
    mine = chat("mine", Document("x.txt", "X text."))
    store.save(mine)
    name = mine.documents[0].text_file
    child = [sys.executable, "-c", CHILD, str(tmp_path)]
    subprocess.run([*child, "save", name], cwd=ROOT, check=True, timeout=60)
    mine.documents.clear()
    store.save(mine)
    assert (store.documents / name).exists(), "a side file another process's chat names was removed"
    subprocess.run([*child, "delete"], cwd=ROOT, check=True, timeout=60)
    assert not (store.documents / name).exists()


def test_removing_a_document_in_the_chat_removes_its_side_file_off_the_gui_thread(qtbot, tmp_path, removals):
    pytest.importorskip("pytestqt")
    from tests.measure_chat_stall import FakeEngine
    from ui.chat_panel import ChatPanel
    from ui.controls import RidgeFillControls
    from ui.ttft_chart import TtftChart

    store = ConversationStore(tmp_path)
    conv = chat("c", Document("x.txt", "X text."), Document("y.txt", "Y text."))
    store.save(conv)
    panel = ChatPanel(FakeEngine(), store, RidgeFillControls(), TtftChart())
    qtbot.addWidget(panel)
    assert panel.load_conversation(store.load("c"))
    panel.remove_document(0)
    assert panel.save_now()
    assert not side(store, conv.documents[0]).exists() and side(store, conv.documents[1]).exists()
    assert removals and all(t is not threading.main_thread() for t, _ in removals)
