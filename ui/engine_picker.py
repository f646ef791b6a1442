"""Which engine answers the chat: this machine's engine child, or an OpenAI-compatible server added with
"Add a server…" (URL, API key, the model list read from GET /v1/models; app/remote_engine.py).

A server that is this app's own `serve` keeps the RidgeFill controls (mode, split, tail go with each
request) and the sources; any other server gets neither, and the controls are greyed out with a note
saying so, not faked. Each answer's line says which engine gave it (ui/format.py).
"""
from __future__ import annotations

from PySide6.QtCore import Slot
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.engine_client import TaskClient
from app.remote_engine import RemoteEngine, RemoteError, RemoteSource, ServerInfo, address
from app.remote_wire import plain_http_warning
from app.remote_servers import RemoteServer, add_server, layout_from_meta, load_servers, remove_server
from ui.background import BackgroundJobs

THIS_MACHINE = "This machine"
OURS_NOTE = "A RidgeFill server: the mode, split and tail go with each question; answers come with sources."
# Said in the dialog before anything is sent: the server reads every document asked about
SENT_NOTE = ("The text of the documents you ask about, and your questions, are sent to this server. Add only a "
             "server you trust with them.")
OTHER_NOTE = ("Not a RidgeFill server: no RidgeFill controls and no sources here (the server does not offer "
              "them). The time to first token is measured on this machine.")


class AddServerDialog(QDialog):
    """URL and API key; "Read models" asks the server (on a worker thread) for its models; Add keeps one."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setWindowTitle("Add a server")
        self.url = QLineEdit()
        self.url.setPlaceholderText("http://192.168.1.20:8080")
        self.key = QLineEdit()
        self.key.setEchoMode(QLineEdit.Password)
        self.key.setPlaceholderText("none")
        self.read_btn = QPushButton("Read models")
        self.models = QComboBox()
        self.status = QLabel("An OpenAI-compatible server: this app's `serve`, llama.cpp's server, vLLM.")
        self.status.setWordWrap(True)
        self.sent_note = QLabel(SENT_NOTE)
        self.sent_note.setWordWrap(True)
        self.http_warning = QLabel()  # plain http to another machine
        self.http_warning.setWordWrap(True)
        self.http_warning.setStyleSheet("color: #b35900;")
        self.http_warning.setVisible(False)
        self.buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        self.buttons.button(QDialogButtonBox.Ok).setText("Add")
        self.buttons.button(QDialogButtonBox.Ok).setEnabled(False)
        form = QFormLayout()
        form.addRow("Address", self.url)
        form.addRow("API key", self.key)
        row = QHBoxLayout()
        row.addWidget(self.models, 1)
        row.addWidget(self.read_btn)
        form.addRow("Model", row)
        lay = QVBoxLayout(self)
        lay.addLayout(form)
        lay.addWidget(self.sent_note)
        lay.addWidget(self.http_warning)
        lay.addWidget(self.status)
        lay.addWidget(self.buttons)
        self.jobs = BackgroundJobs(self)
        self.info: ServerInfo | None = None
        self.read_btn.clicked.connect(self.read_models)
        self.url.textEdited.connect(self._forget)
        self.url.textChanged.connect(self._warn)
        self.key.textEdited.connect(self._forget)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)

    @Slot()
    def read_models(self) -> None:
        try:
            engine = RemoteEngine(self.url.text(), self.key.text())
        except RemoteError as exc:
            self.status.setText(str(exc))
            return
        self.status.setText(f"Reading the models of {engine.server}…")
        self.read_btn.setEnabled(False)
        self.jobs.submit("read models", lambda _ctx: engine.probe(), owner=self, on_done=self._read,
                         on_failed=lambda _type, message: self._failed(message))

    @Slot()
    def _warn(self) -> None:
        """Plain http to another machine: said under the address while it is typed."""
        try:
            text = plain_http_warning(address(self.url.text())[0])
        except RemoteError:
            text = ""
        self.http_warning.setText(text)
        self.http_warning.setVisible(bool(text))

    def _read(self, info: ServerInfo) -> None:
        self.info = info
        self.read_btn.setEnabled(True)
        self.models.clear()
        self.models.addItems(info.models)
        self.status.setText(OURS_NOTE if info.ours else OTHER_NOTE)
        self.buttons.button(QDialogButtonBox.Ok).setEnabled(True)

    def _failed(self, message: str) -> None:
        self.read_btn.setEnabled(True)
        self.status.setText(message)

    @Slot()
    def _forget(self) -> None:
        """Another address or key: the models read before are not this server's."""
        self.info = None
        self.models.clear()
        self.buttons.button(QDialogButtonBox.Ok).setEnabled(False)

    def server(self) -> RemoteServer:
        assert self.info is not None
        key = self.key.text() or address(self.url.text())[1]  # a `user:pass@` in the address: its password
        return RemoteServer(self.info.url, self.models.currentText(), key, self.info.ours,
                            **layout_from_meta(self.info.meta))

    def done(self, r: int) -> None:
        self.jobs.shutdown(1.0)
        super().done(r)


class EnginePicker(QWidget):
    """The chat's engine: a combo (this machine, then the saved servers), "Add a server…", and "Remove"
    for the server chosen (adding one with the same URL and model again replaces it: a new key)."""

    def __init__(self, chat, controls, parent=None):
        super().__init__(parent)
        self.chat, self.controls = chat, controls
        self.combo = QComboBox()
        self.add_btn = QPushButton("Add a server…")
        self.remove_btn = QPushButton("Remove")
        self.remove_btn.setToolTip("Forget the server chosen here (its URL, model and key)")
        self.remove_btn.setEnabled(False)
        self.note = QLabel()
        self.note.setWordWrap(True)
        self.note.setVisible(False)
        row = QHBoxLayout()
        row.addWidget(QLabel("Engine"))
        row.addWidget(self.combo, 1)
        row.addWidget(self.add_btn)
        row.addWidget(self.remove_btn)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addLayout(row)
        lay.addWidget(self.note)
        self.client: TaskClient | None = None  # the chosen server's task client
        self.servers = load_servers()
        self._fill()
        self.combo.currentIndexChanged.connect(self.choose)
        self.add_btn.clicked.connect(self.add_server)
        self.remove_btn.clicked.connect(self.remove_chosen)
        chat.busy_changed.connect(self._busy)  # an answer keeps its engine

    def _fill(self) -> None:
        self.combo.blockSignals(True)
        self.combo.clear()
        self.combo.addItem(THIS_MACHINE)
        for s in self.servers:
            self.combo.addItem(s.label)
        self.combo.blockSignals(False)

    @Slot()
    def add_server(self) -> None:
        dlg = AddServerDialog(self)
        if dlg.exec():
            self.add(dlg.server())

    def add(self, server: RemoteServer) -> None:
        """Save `server` and answer the chat with it from now on."""
        self.servers = add_server(server)
        self._fill()
        self.combo.setCurrentIndex(self.servers.index(server) + 1)

    @Slot()
    def remove_chosen(self) -> None:
        """Forget the server chosen; the chat goes back to this machine."""
        index = self.combo.currentIndex()
        if index <= 0:
            return
        self.servers = remove_server(self.servers[index - 1])
        self._fill()
        self.combo.setCurrentIndex(0)
        self.choose(0)

    def _busy(self, busy: bool) -> None:
        self.combo.setEnabled(not busy)
        self.remove_btn.setEnabled(not busy and self.combo.currentIndex() > 0)

    @Slot(int)
    def choose(self, index: int) -> None:
        self._drop_client()
        self.remove_btn.setEnabled(index > 0)
        if index <= 0:
            self.use_engine(None, None)
            self.controls.setEnabled(True)
            self.controls.show_local()
            self.note.setVisible(False)
            return
        s = self.servers[index - 1]
        engine = RemoteEngine(s.url, s.api_key, s.model)  # its first answer reads /v1/models again
        self.client = TaskClient(RemoteSource(engine), self)
        self.use_engine(self.client, engine)
        self.controls.setEnabled(s.ours)
        if s.ours and s.n_layer >= 2:  # the slider spans the server's model, from its defaults
            self.controls.show_remote(s.n_layer, s.default_split, s.default_tail)
        self.note.setText(OURS_NOTE if s.ours else OTHER_NOTE)
        self.note.setVisible(True)

    def use_engine(self, client: TaskClient | None, remote: RemoteEngine | None) -> None:
        """The chat's answers come from `client` (a server's) from now on; None: this machine's engine."""
        self.chat.engine, self.chat.remote = client or self.chat.service, remote
        self.chat.too_long = ""
        self.chat.request_count()

    def _drop_client(self) -> None:
        if self.client is not None:
            self.client.source.shutdown(1.0)
            self.client.deleteLater()
            self.client = None

    def shutdown(self) -> None:
        self._drop_client()
