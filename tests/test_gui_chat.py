"""The chat tab on the real embedded model (engine in its own process, shared by this module)."""
from __future__ import annotations

import pytest

pytest.importorskip("pytestqt")

from app.conversations import Conversation, ConversationStore, Document, Message  # noqa: E402
from backend.corpus import corpus_texts  # noqa: E402
from backend.protocol import TokenEvent  # noqa: E402
from backend.ridgefill.defaults import DEFAULT_MODE  # noqa: E402
from tests.gui_helpers import attach, make_window, start_service, wait_count, wait_idle, wait_ready  # noqa: E402


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    path = tmp_path_factory.mktemp("rfhome")
    mp.setenv("RIDGEFILL_HOME", str(path))
    yield path
    mp.undo()


@pytest.fixture(scope="module")
def service(qapp, home, model_path):
    svc = start_service(model_path, n_ctx=2048, n_batch=128)
    yield svc
    svc.shutdown()


@pytest.fixture
def window(qtbot, service):
    wait_ready(qtbot, service)
    w = make_window(qtbot, service)
    w.controls.toggle.setChecked(False)
    w.controls.compare.setChecked(False)
    w.new_conversation()
    return w


def ask(qtbot, w, question: str) -> None:
    w.chat.input.setPlainText(question)
    assert w.chat.send()
    wait_idle(qtbot, w)


def test_streamed_reply_appears_token_by_token(qtbot, window, service):
    states = []

    def on_event(ev):
        if isinstance(ev, TokenEvent):
            states.append(window.chat.view.messages[-1].text())

    window.chat.input.setPlainText("Name three colours.")
    assert window.chat.send()
    window.chat._task_primary.connect(on_event=on_event)  # after the panel's own callback
    wait_idle(qtbot, window)
    final = window.chat.view.messages[-1].text()
    assert len(states) >= 3, "tokens should arrive one event at a time"
    assert all(len(a) <= len(b) for a, b in zip(states, states[1:])), "the reply grows, never shrinks"
    assert len(set(states)) >= 3
    assert final.strip() and final.startswith(states[0])
    m = window.chat.conv.messages[-1]
    assert m.complete and m.timings["predicted_n"] >= 3 and m.timings["ttft_ms"] > 0
    assert "TTFT" in window.chat.view.messages[-1].meta.text()


def test_ttft_chart_gains_one_point_per_message_and_two_with_compare(qtbot, window):
    assert window.chart.n_points() == 0
    ask(qtbot, window, "Say hello.")
    assert window.chart.n_points() == 1
    window.controls.compare.setChecked(True)
    ask(qtbot, window, "Say goodbye.")
    assert window.chart.n_points() == 3
    m = window.chat.conv.messages[-1]
    assert m.exact is not None and m.exact["timings"]["ttft_ms"] > 0
    shown = window.chat.view.messages[-1].exact.text()
    assert "exact" in shown and "TTFT" in shown and "×" in shown and ("agree" in shown or "differ" in shown)
    # toggle off: both runs are exact and greedy, so they must agree
    assert "answers agree" in shown


def test_stop_cancels_a_prefill(qtbot, window):
    text = corpus_texts()[0][:5000]  # about 1,100 tokens: nine 128-token chunks
    window.chat.conv.document = Document("harbour.txt", text)
    window.chat.input.setPlainText("Who built the harbour?")
    first_progress = []
    assert window.chat.send()
    window.chat._task_primary.connect(on_event=first_progress.append)
    qtbot.waitUntil(lambda: len(first_progress) > 0, timeout=60_000)
    assert window.chat.stop_btn.isEnabled()
    window.chat.stop_btn.click()
    wait_idle(qtbot, window, 30)
    m = window.chat.conv.messages[-1]
    assert "stopped" in m.note
    assert m.content == "" and m.timings is None, "no answer after a stop during prefill"
    assert all(type(e).__name__ == "ProgressEvent" for e in first_progress)
    assert first_progress[-1].done < first_progress[-1].total
    assert window.chat.send_btn.isEnabled()


def test_stop_cancels_the_chats_task_and_no_other(qtbot, window, service):
    """Stop in the chat stops the chat's answer; a task another panel queued behind it still runs."""
    from app.engine_protocol import CountRequest, TaskKind

    text = corpus_texts()[0][:5000]  # about 1,100 tokens: nine 128-token chunks
    window.chat.conv.document = Document("harbour.txt", text)
    window.chat.input.setPlainText("Who built the harbour?")
    assert window.chat.send()
    answer = window.chat._task_primary
    progress = []
    answer.connect(on_event=progress.append)
    others = {"ping": service.submit(TaskKind.PING),
              "count": service.submit(TaskKind.COUNT, CountRequest(window.chat.build_request("And when?")))}
    qtbot.waitUntil(lambda: len(progress) > 0, timeout=60_000)
    window.chat.stop_btn.click()
    wait_idle(qtbot, window, 30)
    assert answer.state == "cancelled" and "stopped" in window.chat.conv.messages[-1].note
    qtbot.waitUntil(lambda: not any(h.running() for h in others.values()), timeout=60_000)
    assert others["ping"].state == "done" and others["ping"].result == "pong"
    assert others["count"].state == "done" and others["count"].result.prompt_tokens > 200


def test_over_long_document_shows_the_limit_instead_of_sending(qtbot, window, tmp_path):
    doc = tmp_path / "long.txt"
    doc.write_text("\n\n".join(corpus_texts()[:3]), encoding="utf-8")  # ~8K tokens, context 2K
    assert attach(qtbot, window, doc)
    wait_count(qtbot, window)
    label = window.chat.count_label.text()
    assert "Too long" in label and "limit" in label
    assert f"{2048 - 8:,}" in label  # n_ctx minus the room kept for the answer
    assert not window.chat.send_btn.isEnabled()
    n_before = len(window.chat.conv.messages)
    window.chat.input.setPlainText("What is this about?")
    assert not window.chat.send()
    assert len(window.chat.conv.messages) == n_before
    assert window.chat.notice.isVisible() and "tokens" in window.chat.notice.text()


def test_saved_conversation_reloads(qtbot, window, service, home):
    ask(qtbot, window, "What is two plus two?")
    conv_id = window.chat.conv.id
    answer = window.chat.conv.messages[-1].content
    assert answer.strip()
    window.close()
    again = make_window(qtbot, service)  # a fresh window, as after a restart of the app
    assert again.chat.conv.id == conv_id
    assert [m.content for m in again.chat.conv.messages] == ["What is two plus two?", answer]
    assert again.chat.view.messages[-1].text() == answer
    assert again.conv_list.count() >= 1


def test_store_writes_atomically_and_skips_damaged_files(tmp_path):
    store = ConversationStore(tmp_path)
    c = Conversation(title="t", document=Document("d.txt", "text"),
                     messages=[Message("user", "q"), Message("assistant", "partial", complete=False)])
    store.save(c)
    (tmp_path / "broken.json").write_text("{not json", encoding="utf-8")
    loaded = store.load_all()
    assert [x.id for x in loaded] == [c.id]
    assert loaded[0].document.text == "text" and loaded[0].messages[1].complete is False
    assert not list(tmp_path.glob("*.tmp"))


def test_dropping_a_document_attaches_it_and_counts_its_tokens(qtbot, window, tmp_path):
    from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
    from PySide6.QtGui import QDropEvent

    doc = tmp_path / "notes.md"
    doc.write_text("# Notes\n\n" + corpus_texts()[1][:1500], encoding="utf-8")
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(doc))])
    with qtbot.waitSignal(window.chat.documents_read):
        window.chat.dropEvent(QDropEvent(QPointF(5, 5), Qt.CopyAction, mime, Qt.LeftButton, Qt.NoModifier))
    assert window.chat.conv.document is not None and window.chat.conv.document.name == "notes.md"
    wait_count(qtbot, window)
    c = window.chat.last_count
    assert c.fits and 300 < c.prompt_tokens < 1000
    assert f"{c.prompt_tokens:,} tokens of" in window.chat.count_label.text()
    assert window.chat.send_btn.isEnabled()
    bad = tmp_path / "empty.txt"
    bad.write_text("  \n", encoding="utf-8")
    assert not attach(qtbot, window, bad)
    assert "empty" in window.chat.notice.text()
    assert window.chat.conv.document.name == "notes.md"  # the good document stays


def test_settings_round_trip_and_ignore_bad_values(home):
    from app.settings import Settings

    s = Settings(threads=1, n_ctx=4096, hub_endpoint="http://127.0.0.1:9", split=12)
    s.save()
    back = Settings.load()
    assert (back.threads, back.n_ctx, back.hub_endpoint, back.split) == (1, 4096, "http://127.0.0.1:9", 12)
    Settings.path().write_text('{"threads": "many", "n_ctx": 2048}', encoding="utf-8")
    back = Settings.load()
    assert back.threads == 0 and back.n_ctx == 2048
    Settings.path().write_text("{broken", encoding="utf-8")
    assert Settings.load() == Settings()


def test_split_slider_label_and_maps_status_follow_the_split(qtbot, window):
    c = window.controls
    assert c.slider.minimum() == 1 and c.slider.maximum() == 29  # the embedded model's 30 layers
    c.slider.setValue(5)
    assert c.split_label.text().startswith("S = 5: layers 5–29 predicted for bulk rows; layers 0–4 exact")
    qtbot.waitUntil(lambda: window.maps_tasks.check_task is None and "split 5" in c.maps_label.text(), timeout=60_000)
    assert c.maps_status in ("verified", "warning", "refused", "missing")
    if c.maps_status == "missing":
        assert "split 5" in c.maps_reasons.text() and c.get_btn.isEnabled()
    req = window.chat.build_request("q")
    assert (req.mode, req.split, req.tail) == ("off", None, None)  # the toggle is off in these tests
    c.toggle.setChecked(True)
    req = window.chat.build_request("q")
    # the mode box starts at the default; the tail left at the model's default is asked as None (the engine's)
    assert (req.mode, req.split, req.tail) == (DEFAULT_MODE, 5, None)
    assert "use guided" not in c.split_label.text()
    c.mode_box.setCurrentIndex(c.mode_box.findData("speed"))  # below the default split: speed is told off
    assert f"Below S = {c.model_defaults[0]}, use guided" in c.split_label.text()
    c.mode_box.setCurrentIndex(c.mode_box.findData(DEFAULT_MODE))
    assert "use guided" not in c.split_label.text()
    c.tail_spin.setValue(c.tail() + 64)
    c.slider.setValue(c.model_defaults[0])
    req = window.chat.build_request("q")
    assert (req.split, req.tail) == (None, c.model_defaults[1] + 64)  # what the user moved, and only that


def test_generation_settings_persist_per_model(qtbot, window, service, home, tmp_path, model_path):
    """The Generation section shows each model's defaults (its file's recommendation, else the app's),
    keeps what the user changed per model file, saves it, and the chat's next question uses it."""
    import json
    from pathlib import Path

    from app.conversations import ConversationStore
    from app.settings import Settings
    from backend.sampling import APP_DEFAULTS
    from tests.tiny_gguf import write_tiny_gguf
    from ui.main_window import MainWindow

    g = window.generation
    embedded = Path(model_path).name
    assert g.params() == APP_DEFAULTS and "app's defaults" in g.source.text() and not g.reset_btn.isEnabled()
    g.boxes["temperature"].setValue(0.7)
    g.boxes["seed"].setValue(42)
    g.boxes["dry_multiplier"].setValue(1.25)
    g.boxes["dry_penalty_last_n"].setValue(-1)  # shown as "whole answer"
    g.max_tokens_box.setValue(300)
    assert window.chat.sampling.temperature == 0.7 and window.chat.max_tokens == 300  # the next question's
    assert (window.chat.sampling.dry_multiplier, window.chat.sampling.dry_penalty_last_n) == (1.25, -1)
    assert g.boxes["dry_penalty_last_n"].text() == "whole answer"
    qtbot.waitUntil(lambda: Settings.path().exists() and json.loads(Settings.path().read_text(encoding="utf-8"))
                    .get("generation", {}).get(embedded, {}).get("temperature") == 0.7, timeout=5000)

    other = write_tiny_gguf(tmp_path / "recommends.gguf", "llama", sampling={"general.sampling.temp": 0.5})
    window.show_model(str(other))  # another model file: its own defaults, from its file
    assert g.params().temperature == 0.5 and g.params().seed == -1 and "model file" in g.source.text()
    assert window.chat.sampling.temperature == 0.5 and window.chat.max_tokens == window.settings.max_tokens
    assert g.params().dry_multiplier == APP_DEFAULTS.dry_multiplier
    window.show_model(model_path)  # back: what was saved for the embedded model
    assert (g.params().temperature, g.params().seed, g.max_tokens()) == (0.7, 42, 300)
    assert (g.params().dry_multiplier, g.params().dry_sequence_breakers) == (1.25, APP_DEFAULTS.dry_sequence_breakers)

    again = MainWindow(Settings.load(), service, ConversationStore(), owns_service=False)  # the next start
    qtbot.addWidget(again)
    assert (again.generation.params().temperature, again.generation.max_tokens()) == (0.7, 300)
    assert again.chat.sampling.seed == 42 and again.chat.sampling.dry_multiplier == 1.25
    g.reset_btn.click()  # back to the model's defaults: nothing saved for it any more
    assert g.params() == APP_DEFAULTS and embedded not in window.settings.generation


def test_both_runs_of_a_comparison_draw_with_one_seed(qtbot, window, monkeypatch):
    """With sampling on and a random seed, compare-with-exact sends the same parameters and seed twice
    (both exact here, so the answers must agree); a loop is cut short in both."""
    window.generation.boxes["temperature"].setValue(0.9)
    window.controls.compare.setChecked(True)
    sent = []
    submit = window.chat.service.submit

    def spy(kind, payload, **kw):
        sent.append(payload)
        return submit(kind, payload, **kw)

    monkeypatch.setattr(window.chat.service, "submit", spy)
    ask(qtbot, window, "Write one sentence about the sea.")
    monkeypatch.undo()
    runs = [p for p in sent if getattr(p, "messages", None) and getattr(p, "stop_loops", False)]
    assert len(runs) == 2 and runs[0].sampling == runs[1].sampling and runs[0].sampling.seed >= 0
    assert runs[0].sampling.temperature == 0.9
    assert "answers agree" in window.chat.view.messages[-1].exact.text()


def test_the_view_follows_a_growing_answer_until_the_user_scrolls_up(qtbot):
    from ui.chat_view import ChatView

    view = ChatView()
    qtbot.addWidget(view)
    view.resize(400, 300)
    view.show()
    view.add("user", "A question")
    answer = view.add("assistant", "")
    bar = view.verticalScrollBar()

    def stream(lines: int) -> None:  # as ChatPanel does per token: the text grows, then the meta line
        for i in range(lines):
            answer.append(f"line {i} of a long answer\n")
            answer.set_meta("answering…")
            qtbot.wait(5)

    stream(40)
    qtbot.waitUntil(lambda: bar.maximum() > 0 and bar.value() == bar.maximum(), timeout=5000)
    bar.setValue(0)  # the user scrolls up to read the start
    stream(20)
    assert bar.value() == 0
    bar.setValue(bar.maximum())  # and back down: the view follows again
    stream(20)
    qtbot.waitUntil(lambda: bar.value() == bar.maximum(), timeout=5000)


def test_messages_take_the_height_their_wrapped_text_needs_and_no_more(qtbot):
    """Each label as tall as its text wrapped at its width (nothing cut off), and no blank band under
    the last message (a label's size hint, taken at another width, must not set the height)."""
    from ui.chat_view import ChatView

    view = ChatView()
    qtbot.addWidget(view)
    view.resize(500, 300)
    view.show()
    sentence = "The default value of maxFreeSockets is 256, as the manual says in its list of options. "
    for _ in range(2):
        view.add("user", "What is the default value of maxFreeSockets?")
        answer = view.add("assistant", "")
        for _ in range(12):
            answer.append(sentence)
            answer.set_meta("answering…")
            qtbot.wait(5)
        answer.set_exact("TTFT RidgeFill (guided) 29.08 s · exact 58.41 s · exact/this 2.01× · answers differ ✗\n"
                         "Exact answer: " + sentence * 3)
        answer.set_meta("TTFT 29.08 s · prompt 6,124 tok @ 211 tok/s · answer 168 tok @ 5.9 tok/s · guided S=12 "
                        "T=64 bulk 6,060 (193 exact)\nstopped: the answer said the same sentence three times")
    qtbot.wait(200)
    for w in view.messages:
        for label in (w.body, w.meta, w.exact):
            if label.isVisible():
                assert label.height() >= label.heightForWidth(label.width()), label.text()[:40]
    blank = view.widget().height() - view.messages[-1].geometry().bottom()
    assert blank < 40, f"{blank} px of blank space under the last message"


def test_documents_are_read_off_the_gui_thread_and_stop_stops_waiting(qtbot, window, tmp_path, monkeypatch):
    import threading

    from ui import chat_documents

    chat, release, readers, real_read = window.chat, threading.Event(), [], chat_documents.read_each

    def slow_read(paths, stopped):  # a long PDF: seconds before the reading ends
        readers.append(threading.current_thread())
        release.wait(30)
        return real_read(paths, stopped)

    monkeypatch.setattr(chat_documents, "read_each", slow_read)
    doc = tmp_path / "manual.txt"
    doc.write_text("The daily limit is 500 requests. " * 50, encoding="utf-8")
    assert chat.attach_documents([doc])
    qtbot.waitUntil(lambda: bool(readers))
    assert readers[0] is not threading.main_thread(), "the document was read on the GUI thread"
    assert chat.busy() and "Reading manual.txt" in chat.doc_label.text()
    assert chat.stop_btn.isEnabled() and not chat.send_btn.isEnabled() and not chat.attach_btn.isEnabled()
    assert not chat.attach_documents([doc])  # one reading at a time
    with qtbot.waitSignal(chat.documents_read) as read:
        chat.stop_btn.click()
    assert read.args == [False] and "Stopped reading" in chat.notice.text() and not chat.busy()
    release.set()  # the reading ends after all: what it read is not attached
    qtbot.wait(300)
    assert not chat.conv.documents and chat.attach_btn.isEnabled()
    assert attach(qtbot, window, doc) and chat.conv.documents[0].name == "manual.txt"


def test_a_config_file_of_the_wrong_shape_is_said_in_the_window(qtbot, service, home):
    """servers.json holding {"servers": 1}: the window starts, with no servers, and says what it did."""
    from app.remote_servers import servers_path

    wait_ready(qtbot, service)
    path = servers_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"servers": 1}', encoding="utf-8")
    try:
        w = make_window(qtbot, service)
        assert w.chat.notice.isVisible() and "servers.json" in w.chat.notice.text()
    finally:
        path.unlink(missing_ok=True)

