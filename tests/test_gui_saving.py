"""Saving never blocks the GUI thread (issue 65, item 2): a chat's document text is written once, in a side file
its chat file names (old files holding it inline still load); the chat is written by the store's writer thread
from a snapshot taken on the GUI thread, the latest snapshot winning; the conversation list is kept in memory;
a streamed answer grows by appending. The full-disk notice and retry are tests/test_gui_full_disk.py's."""
from __future__ import annotations

import json
import threading
import time

import pytest

pytest.importorskip("pytestqt")

from app.conversation_writer import CoalescingWriter  # noqa: E402
from app.conversations import Conversation, ConversationStore, Document, Message, snapshot  # noqa: E402
from tests.gui_helpers import make_window, start_service, wait_ready  # noqa: E402
from tests.measure_chat_stall import SENTENCE, FakeEngine, measure  # noqa: E402

STALL_BOUND_MS = 250  # generous: the loop ticks every 10 ms; a write on the GUI thread stalls it a whole second
SLOW_WRITE_S = 1.0


def test_old_chat_files_with_the_text_inline_load_and_are_saved_with_a_side_file_written_once(tmp_path):
    store = ConversationStore(tmp_path)
    old = {"id": "old1", "title": "old", "created": 1.0, "updated": 2.0,
           "documents": [{"name": "a.txt", "text": "Alpha text.\ud800", "page_starts": [], "path": "/x/a.txt"}],
           "messages": [{"role": "user", "content": "q"}]}
    (tmp_path / "old1.json").write_text(json.dumps(old), encoding="utf-8")
    conv = store.load("old1")
    assert [(d.name, d.text, d.text_file) for d in conv.documents] == [("a.txt", "Alpha text.\ud800", "")]
    store.save(conv)
    saved = json.loads((tmp_path / "old1.json").read_text(encoding="utf-8"))
    doc = saved["documents"][0]
    assert "text" not in doc and doc["text_file"] == conv.documents[0].text_file  # named, not held
    side = tmp_path / "documents" / doc["text_file"]
    assert side.stat().st_mode & 0o777 == 0o600
    first_write = side.stat().st_ino, side.stat().st_mtime_ns
    conv.messages.append(Message("assistant", "a"))
    store.save(conv)
    assert (side.stat().st_ino, side.stat().st_mtime_ns) == first_write, "the document's text was written again"
    back = store.load("old1")
    assert back.documents == conv.documents and [m.content for m in back.messages] == ["q", "a"]
    assert [s.title for s in store.summaries()] == ["old"]


def test_a_side_file_name_that_is_a_path_is_refused(tmp_path):
    store = ConversationStore(tmp_path)
    bad = {"id": "bad1", "documents": [{"name": "a.txt", "text_file": "../../secret.txt"}], "messages": []}
    (tmp_path / "bad1.json").write_text(json.dumps(bad), encoding="utf-8")
    with pytest.raises(ValueError, match="documents"):
        store.load("bad1")


def test_a_snapshot_is_a_copy_later_changes_do_not_reach(tmp_path):
    conv = Conversation(documents=[Document("a.txt", "text")],
                        messages=[Message("user", "q"), Message("assistant", "par", complete=False,
                                                                sources=[{"document": "a.txt", "score": 0.5}])])
    snap = snapshot(conv)
    before = snap.chat_text()
    conv.messages[-1].content += "tial"
    conv.messages[-1].sources[0]["score"] = 0.9
    conv.messages.append(Message("user", "again"))
    conv.title = "changed"
    assert snap.chat_text() == before


def test_the_writer_writes_the_latest_snapshot_of_each_key_in_order_on_its_own_thread():
    release, written, threads = threading.Event(), [], set()

    def write(item):
        threads.add(threading.current_thread())
        if item == "a1":
            release.wait(10)
        written.append(item)
        return item.upper()

    writer, told = CoalescingWriter(write), []
    writer.put("a", "a1", lambda item, result, error: told.append((item, result, error)))
    deadline = time.monotonic() + 10
    while not written and not release.is_set() and writer.pending(lambda k: k == "a") and time.monotonic() < deadline:
        if threads:
            break
        time.sleep(0.01)
    for item in ("a2", "a3"):  # while a1 is being written: only the latest of these is written after it
        writer.put("a", item)
    writer.put("b", "b1")
    assert writer.pending(lambda k: k == "b")
    release.set()
    assert writer.wait(timeout=10)
    assert written == ["a1", "a3", "b1"] and told == [("a1", "A1", None)]
    assert threading.main_thread() not in threads and not writer.pending()


def test_an_answer_streams_with_the_loop_ticking_while_the_chat_is_written_slowly_off_the_gui_thread(
        qtbot, tmp_path, monkeypatch):
    from ui.chat_panel import ChatPanel
    from ui.controls import RidgeFillControls
    from ui.ttft_chart import TtftChart

    store = ConversationStore(tmp_path / "chats")
    writes, real_write = [], store.write

    def slow_write(snap):  # a slow disk: each write of the chat takes a second
        writes.append(threading.current_thread())
        time.sleep(SLOW_WRITE_S)
        return real_write(snap)

    monkeypatch.setattr(store, "write", slow_write)
    engine = FakeEngine()
    panel = ChatPanel(engine, store, RidgeFillControls(), TtftChart())
    qtbot.addWidget(panel)
    panel.show()
    text = SENTENCE * (30_000_000 // len(SENTENCE))  # a 30 MB document
    assert panel.load_conversation(Conversation(title="big", documents=[Document("big.txt", text)]))
    gaps, _end = measure(panel, engine, "What is the daily limit?", tokens=200, every_ms=10)
    assert writes, "nothing was written while the answer streamed"
    assert threading.main_thread() not in writes, "the chat was written on the GUI thread"
    assert max(gaps) <= STALL_BOUND_MS, f"the GUI stalled {max(gaps):.0f} ms while the chat was saved"
    assert len(gaps) >= 100  # the loop ticked on through the answer (about 2 s of tokens)
    assert panel.save_now()  # waits for the writes still under way
    back = store.load(panel.conv.id)
    assert back.messages[-1].content == panel.conv.messages[-1].content and back.messages[-1].complete
    assert back.documents[0].text == text


def test_the_count_at_an_answers_end_carries_the_documents_apart_from_the_turns(qtbot, tmp_path):
    from app.engine_protocol import TaskKind
    from ui.chat_panel import ChatPanel
    from ui.controls import RidgeFillControls
    from ui.ttft_chart import TtftChart

    engine = FakeEngine()
    counts, real_submit = [], engine.submit
    engine.submit = lambda kind, payload=None, **kw: (
        counts.append(payload) if kind == TaskKind.COUNT else None) or real_submit(kind, payload, **kw)
    panel = ChatPanel(engine, ConversationStore(tmp_path / "chats"), RidgeFillControls(), TtftChart())
    qtbot.addWidget(panel)
    panel.show()
    text = SENTENCE * 100
    assert panel.load_conversation(Conversation(title="doc", documents=[Document("doc.txt", text)]))
    measure(panel, engine, "What is the daily limit?", tokens=5, every_ms=10)
    assert not panel.busy() and counts, "the answer's end asked for no count"
    asked = counts[-1]  # the next prompt's, asked at the answer's end
    assert asked.documents_apart and SENTENCE not in "".join(m.content for m in asked.request.messages)
    assert asked.request.documents[0].text is text  # the document goes by reference: its text is not copied
    assert asked.framed().messages == panel.build_request("?").messages  # framed, it is what an answer sends


def test_a_streamed_answer_grows_by_appending_and_stays_wrapped_and_selectable(qtbot, monkeypatch):
    from PySide6.QtCore import Qt

    from ui.chat_view import ChatView

    view = ChatView()
    qtbot.addWidget(view)
    view.resize(400, 300)
    view.show()
    answer = view.add("assistant", "")
    set_whole = []
    monkeypatch.setattr(answer.body, "setPlainText", lambda t: set_whole.append(t))
    monkeypatch.setattr(answer.body, "setText", lambda t: set_whole.append(t))
    one_line = answer.body.height()
    pieces = [f" word{i}" for i in range(300)]
    for p in pieces:
        answer.append(p)
    qtbot.wait(20)
    assert not set_whole, "each token set the whole text again"
    assert answer.text() == "".join(pieces)
    assert answer.body.height() > 5 * one_line, "the text is not wrapped (or its frame did not grow with it)"
    assert answer.body.height() >= answer.body.heightForWidth(answer.body.width())
    assert answer.body.textInteractionFlags() & Qt.TextSelectableByMouse
    cursor = answer.body.textCursor()
    cursor.select(cursor.SelectionType.Document)
    answer.body.setTextCursor(cursor)
    assert answer.body.textCursor().selectedText().replace("\u2029", "\n") == "".join(pieces)


@pytest.fixture(scope="module")
def service(qapp, model_path):
    svc = start_service(model_path, n_ctx=2048, n_batch=128)
    yield svc
    svc.shutdown()


def test_the_list_follows_a_change_in_memory_and_quitting_waits_for_a_slow_write(qtbot, service, tmp_path,
                                                                                   monkeypatch):
    wait_ready(qtbot, service)
    store = ConversationStore(tmp_path / "chats")
    store.save(Conversation(id="older", title="Older chat", messages=[Message("user", "q")]))
    w = make_window(qtbot, service, store=store)
    assert w.chat.conv.id == "older"  # the latest chat, from the folder read at start
    reads = []
    for name in ("summaries", "load_all"):
        monkeypatch.setattr(store, name, lambda real=getattr(store, name), name=name: reads.append(name) or real())
    w.new_conversation()
    chat = w.chat
    chat.conv.title = "What is new?"
    chat.conv.messages.append(Message("user", "What is new?"))
    chat.save()
    chat.conversation_changed.emit(chat.conv)
    assert [w.conv_list.item(i).text() for i in range(w.conv_list.count())] == ["What is new?", "Older chat"]
    assert not reads, "the list read the folder again for a change it was told of"
    real_write = store.write
    monkeypatch.setattr(store, "write", lambda snap: time.sleep(SLOW_WRITE_S) or real_write(snap))
    chat.conv.messages.append(Message("user", "one more"))
    chat.save()
    assert w.close()  # quitting waits for the write under way
    assert ConversationStore(tmp_path / "chats").load(chat.conv.id).messages[-1].content == "one more"


def test_the_window_has_the_writer_remove_side_files_no_chat_names_at_start(qtbot, service, tmp_path):
    wait_ready(qtbot, service)
    store = ConversationStore(tmp_path / "chats")
    kept = Conversation(id="kept", documents=[Document("a.txt", "Alpha text.")], messages=[Message("user", "q")])
    store.save(kept)
    stray = store.documents / ("f" * 32 + ".txt")  # the side file of a chat deleted while the app was closed
    stray.write_text("Beta text.")
    make_window(qtbot, service, store=store)
    assert store.flush(timeout=10)
    assert not stray.exists() and (store.documents / kept.documents[0].text_file).exists()
