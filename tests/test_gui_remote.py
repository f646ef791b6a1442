"""The GUI as a client of a remote engine (ui/engine_picker.py): "Add a server…" reads the model list from
GET /v1/models, the chat answers from the chosen server, and each answer says which engine gave it. Against
this app's `serve` in another process (RidgeFill controls stay, the mode goes with the question, sources
come back) and llama.cpp's own server (controls greyed out, no sources, said so); a server that cannot be
reached gives a message that names it, and the chat keeps everything it had."""
from __future__ import annotations

import os
import stat

import pytest

pytest.importorskip("pytestqt")
pytest.importorskip("openai")

from app.remote_servers import RemoteServer, load_servers, servers_path  # noqa: E402
from tests.gui_helpers import attach, make_window, start_service, wait_idle, wait_ready  # noqa: E402
from tests.remote_servers import KEY, free_port, start_llama, start_ours  # noqa: E402
from tests.test_remote_engine import PAGE1, PAGE2  # noqa: E402
from ui.controls import SETTLE_MS  # noqa: E402
from ui.engine_picker import OTHER_NOTE, OURS_NOTE, THIS_MACHINE, AddServerDialog, EnginePicker  # noqa: E402

DOC = PAGE1 + PAGE2  # long enough for RidgeFill to run on the server


@pytest.fixture(scope="module")
def servers(tmp_path_factory, model_path):
    home = tmp_path_factory.mktemp("servers")
    ours = start_ours(home)
    try:
        llama = start_llama(home, model_path)
    except BaseException:
        ours.stop()
        raise
    yield ours, llama
    ours.stop()
    llama.stop()


def add_through_dialog(qtbot, picker: EnginePicker, url: str, key: str = "") -> AddServerDialog:
    dlg = AddServerDialog(picker)
    qtbot.addWidget(dlg)
    dlg.url.setText(url)
    dlg.key.setText(key)
    dlg.read_btn.click()
    qtbot.waitUntil(lambda: dlg.models.count() > 0, timeout=60_000)
    picker.add(dlg.server())
    return dlg


def ask(qtbot, w, question: str):
    w.chat.input.setPlainText(question)
    assert w.chat.send()
    wait_idle(qtbot, w)
    return w.chat.conv.messages[-1]


def test_a_chat_against_our_server_then_llama_cpp_then_an_unreachable_one(qtbot, model_path, servers, tmp_path):
    ours, llama = servers
    service = start_service(model_path, n_ctx=1024)
    try:
        wait_ready(qtbot, service)
        w = make_window(qtbot, service, max_tokens=10)
        picker = w.findChild(EnginePicker)
        assert picker.combo.currentText() == THIS_MACHINE and picker.combo.count() == 1
        doc = tmp_path / "survey.txt"
        doc.write_text(DOC)
        assert attach(qtbot, w, str(doc))

        w.controls.slider.setValue(3)  # this machine's split, to come back to
        dlg = add_through_dialog(qtbot, picker, ours.url, KEY)
        assert dlg.status.text() == OURS_NOTE and dlg.models.currentText() == dlg.server().model
        assert picker.combo.currentText() == f"{dlg.server().model} at {ours.url}" and w.controls.isEnabled()
        remote = dlg.server()  # the slider follows the server's model: its layers and default split
        assert remote.n_layer == 30 and remote.default_split == 18 and remote.default_tail > 0
        assert (w.controls.slider.maximum(), w.controls.split(), w.controls.tail()) == (29, 18, remote.default_tail)
        assert w.controls.get_btn.isHidden() and w.controls.maps_label.isHidden()  # they act on this machine
        with qtbot.assertNotEmitted(w.controls.split_settled, wait=SETTLE_MS + 300):
            w.controls.slider.setValue(20)  # the server's maps are not this machine's to check
        w.controls.slider.setValue(18)
        assert ours.url in w.chat.count_label.text()
        w.controls.mode_box.setCurrentIndex(w.controls.mode_box.findData("speed"))
        w.controls.toggle.setChecked(True)
        answer = ask(qtbot, w, "What is the cat's name?")
        assert answer.complete and answer.content and not answer.note
        assert answer.timings["engine"].endswith(ours.url) and answer.timings["server"]["mode"] == "speed"
        assert answer.sources and {s["document"] for s in answer.sources} == {"survey.txt"}
        meta = w.chat._answer_widget.meta.text()
        assert meta.startswith(f"answered by {answer.timings['engine']}") and "speed S=" in meta
        w.controls.compare.setChecked(True)  # the compare with exact, over the wire: both runs on the server
        answer = ask(qtbot, w, "What is the cat's name?")
        assert answer.complete and answer.exact and answer.exact["content"]
        assert answer.exact["timings"]["engine"].endswith(ours.url) and answer.exact["timings"]["server"]["mode"] == "off"
        assert "exact" in w.chat._answer_widget.exact.text().lower()
        w.controls.compare.setChecked(False)

        dlg = add_through_dialog(qtbot, picker, llama.url)
        assert dlg.status.text() == OTHER_NOTE
        assert not w.controls.isEnabled() and picker.note.text() == OTHER_NOTE
        answer = ask(qtbot, w, "How long is the old pier?")
        assert answer.complete and answer.content and answer.timings["engine"].endswith(llama.url)
        assert not answer.sources and "no sources" in answer.timings["sources_note"]
        stored = {(s.url, s.ours) for s in load_servers()}
        assert stored == {(ours.url + "/v1", True), (llama.url + "/v1", False)}
        assert stat.S_IMODE(os.stat(servers_path()).st_mode) == 0o600  # it holds the keys

        before = [(m.role, m.content) for m in w.chat.conv.messages]
        gone = f"http://127.0.0.1:{free_port()}"
        picker.add(RemoteServer(gone + "/v1", "some-model"))
        answer = ask(qtbot, w, "Is the boat green?")
        assert not answer.complete and answer.note.startswith(f"Cannot reach the server {gone}")
        assert w.chat.notice.isVisible() and gone in w.chat.notice.text()
        assert [(m.role, m.content) for m in w.chat.conv.messages][:len(before)] == before  # nothing lost
        assert w.chat.store.load(w.chat.conv.id).messages[-2].content == "Is the boat green?"  # saved
        assert w.chat.send_btn.isEnabled()  # a server's error does not block the next question

        n_servers = picker.combo.count()
        assert picker.remove_btn.isEnabled()
        picker.remove_btn.click()  # the unreachable server is forgotten, on disk too
        assert picker.combo.count() == n_servers - 1 and picker.combo.currentText() == THIS_MACHINE
        assert all(not s.url.startswith(gone) for s in load_servers()) and len(load_servers()) == n_servers - 2
        assert not picker.remove_btn.isEnabled()

        picker.combo.setCurrentIndex(0)  # back to this machine: the controls and the count come back
        assert w.chat.engine is service and w.controls.isEnabled()
        assert w.controls.split() == 3 and not w.controls.get_btn.isHidden()  # as it was before the server
    finally:
        service.shutdown()
