"""The GUI thread never waits on a disk to open a chat or list the chats, nor copies a document to send a
question (issue 65, item 2): the store's writer thread reads the chat file and its documents' side files
(app/conversation_reading.py); the chat shows at once as loading, its messages then its text, and Send waits
for the text; the question's requests carry the documents apart from the turns, framed in by the engine child."""
from __future__ import annotations

import threading

import pytest

pytest.importorskip("pytestqt")

from app import chat_session  # noqa: E402
from app.conversation_reading import open_chat  # noqa: E402
from app.conversations import Conversation, ConversationStore, Document, Message  # noqa: E402
from app.engine_protocol import TaskKind, TaskMessage  # noqa: E402
from backend.documents import framed  # noqa: E402
from tests.gui_helpers import make_window, start_service, wait_ready  # noqa: E402
from tests.measure_chat_stall import SENTENCE, FakeEngine  # noqa: E402

TEXT = SENTENCE * 200


def saved_chat(store: ConversationStore, conv_id: str = "doc1", title: str = "doc") -> Conversation:
    """A chat with a document, saved now (the latest saved is the newest)."""
    conv = Conversation(id=conv_id, title=title, documents=[Document("doc.txt", TEXT)],
                        messages=[Message("user", "What is the limit?"), Message("assistant", "500.")])
    store.save(conv)
    return conv


def threads_of(monkeypatch, store: ConversationStore, names=("read", "read_text", "read_summaries", "load",
                                                             "summaries")) -> dict[str, set]:
    """Which threads call each of the store's reads."""
    seen: dict[str, set] = {name: set() for name in names}
    for name in names:
        real = getattr(store, name)

        def spy(*args, real=real, name=name, **kw):
            seen[name].add(threading.current_thread())
            return real(*args, **kw)
        monkeypatch.setattr(store, name, spy)
    return seen


def make_panel(qtbot, store):
    from ui.chat_panel import ChatPanel
    from ui.controls import RidgeFillControls
    from ui.ttft_chart import TtftChart

    engine, controls, chart = FakeEngine(), RidgeFillControls(), TtftChart()
    panel = ChatPanel(engine, store, controls, chart)
    for widget in (panel, controls, chart):  # all closed at the test's end: a chart left over is laid out later
        qtbot.addWidget(widget)
    panel.show()
    return panel, engine


def test_a_chat_opens_at_once_as_loading_its_text_read_off_the_gui_thread_and_send_waits_for_it(
        qtbot, tmp_path, monkeypatch):
    store = ConversationStore(tmp_path / "chats")
    saved_chat(store)
    seen = threads_of(monkeypatch, store)
    disk, real_read_text = threading.Event(), store.read_text
    monkeypatch.setattr(store, "read_text", lambda f: disk.wait(10) and real_read_text(f))  # a slow disk
    panel, engine = make_panel(qtbot, store)
    panel.input.setPlainText("And per hour?")

    assert panel.open_conversation(["doc1"], "doc")
    assert panel.conv.id == "doc1" and panel.loading and "Loading" in panel.doc_label.text()
    qtbot.waitUntil(lambda: len(panel.view.messages) == 2)  # the chat file read: its messages shown
    assert "Loading the document doc.txt" in panel.doc_label.text() and not panel.pane.isVisible()
    assert not panel.send_btn.isEnabled() and not panel.attach_btn.isEnabled()
    assert not panel.send() and not engine.answers  # Send waits for the text
    disk.set()
    qtbot.waitUntil(lambda: not panel.loading)
    assert panel.conv.documents[0].text == TEXT and "doc.txt" in panel.doc_label.text()
    assert panel.pane.isVisible() and panel.send_btn.isEnabled()
    assert seen["read"] and seen["read_text"]
    assert threading.main_thread() not in set().union(*seen.values()), "a chat was read on the GUI thread"
    assert panel.send() and len(engine.answers) == 1


def test_a_chat_that_cannot_be_read_says_so_and_a_new_chat_is_shown(qtbot, tmp_path):
    store = ConversationStore(tmp_path / "chats")
    conv = saved_chat(store)
    (store.documents / conv.documents[0].text_file).unlink()
    panel, _engine = make_panel(qtbot, store)
    with qtbot.waitSignal(panel.open_failed, timeout=10_000):
        assert panel.open_conversation(["doc1"])
    assert not panel.loading and panel.conv.id != "doc1" and not panel.conv.messages
    assert "could not be opened" in panel.notice.text() and "doc.txt" not in panel.doc_label.text()


def test_open_chat_tells_the_chat_then_its_texts_and_falls_back_to_the_next_that_reads(tmp_path):
    store = ConversationStore(tmp_path / "chats")
    saved_chat(store)
    (store.folder / "bad1.json").write_text("{not json", encoding="utf-8")
    told = []
    open_chat(store, ["bad1", "doc1"], told.append)
    assert [what for what, _ in told] == ["chat", "texts"]
    assert told[0][1].id == "doc1" and told[0][1].documents[0].text == ""  # not read yet
    assert told[1][1] == [TEXT]


def test_the_questions_requests_hold_no_copy_of_the_document_built_on_the_gui_thread(qtbot, tmp_path):
    panel, engine = make_panel(qtbot, ConversationStore(tmp_path / "chats"))
    conv = Conversation(title="doc", documents=[Document("doc.txt", TEXT)])
    assert panel.load_conversation(conv)
    panel.controls.compare.setEnabled(True)
    panel.controls.compare.setChecked(True)
    panel.input.setPlainText("What is the daily limit?")
    sent, real_submit = [], engine.submit
    engine.submit = lambda kind, payload=None, **kw: (
        sent.append(payload) if kind == TaskKind.COMPLETE else None) or real_submit(kind, payload, **kw)
    assert panel.send()
    primary, compared = sent
    for req in (primary, compared):
        assert SENTENCE not in "".join(m.content for m in req.messages), "the document was framed on the GUI thread"
        assert req.unframed_documents[0].text is TEXT  # by reference: not copied
    assert primary.documents[0].text is TEXT and compared.documents is None  # the exact run looks for no sources
    asked = chat_session.build_request(conv, "What is the daily limit?", mode="off").messages
    assert framed(primary).messages == asked == framed(compared).messages  # what the model reads


def test_the_engine_child_frames_a_completion_sent_apart_before_it_runs():
    from app.engine_child import _framed

    conv = Conversation(documents=[Document("doc.txt", TEXT)])
    req = chat_session.build_request(conv, "When?", mode="off", frame_documents=False)
    events = []
    task = _framed(TaskMessage(7, TaskKind.COMPLETE, req), _Queue(events))
    assert task.payload.messages == chat_session.build_request(conv, "When?", mode="off").messages
    assert task.payload.unframed_documents is None and not events
    empty = chat_session.build_request(Conversation(documents=[Document("e.txt", " ")]), "When?", mode="off",
                                       frame_documents=False)
    assert _framed(TaskMessage(8, TaskKind.COMPLETE, empty), _Queue(events)) is None
    assert events[0].id == 8 and events[0].error_type == "EmptyDocumentError"  # failed, not the child's end


class _Queue:
    def __init__(self, items: list):
        self.items = items

    def put(self, item) -> None:
        self.items.append(item)


@pytest.fixture(scope="module")
def service(qapp, model_path):
    svc = start_service(model_path, n_ctx=2048, n_batch=128)
    yield svc
    svc.shutdown()


def test_the_windows_start_lists_and_opens_the_chats_off_the_gui_thread(qtbot, service, tmp_path, monkeypatch):
    wait_ready(qtbot, service)
    store = ConversationStore(tmp_path / "chats")
    saved_chat(store, "older", "Older chat")
    saved_chat(store, "latest", "Latest chat")
    seen = threads_of(monkeypatch, store)
    w = make_window(qtbot, service, store=store)  # waits until the chats are listed and the latest is open
    assert w.chat.conv.id == "latest" and w.chat.conv.documents[0].text == TEXT and not w.chat.loading
    titles = [w.conv_list.item(i).text() for i in range(w.conv_list.count())]
    assert titles == ["Latest chat", "Older chat"]
    w.conv_list.setCurrentRow(1)  # a click on the older chat
    assert w.chat.conv.id == "older" and w.chat.loading  # shown at once, as loading
    qtbot.waitUntil(lambda: not w.chat.reading())
    w.refresh_conversations()
    qtbot.waitUntil(lambda: not w.chat.reading())
    assert w.chat.conv.documents[0].text == TEXT and w.conv_list.count() == 2
    assert seen["read_summaries"] and seen["read"] and seen["read_text"]
    assert threading.main_thread() not in set().union(*seen.values()), "the chats were read on the GUI thread"
