"""The GUI's "Serve on localhost:8080" switch: the OpenAI-compatible server (app/server) in front of the
engine the window already has.

`QtGateway` lets the server, on its own thread, use the window's EngineClient, which lives on the GUI
thread: a submit or cancel from the server is carried to the GUI thread by a queued signal, and the
client's poll delivers each task's messages (app/task_stream.py's Task) to the server's listener there.
The chat's tasks and the server's share the one engine, and its one pending table, in arrival order.
"""
from __future__ import annotations

import logging
from typing import Any

from PySide6.QtCore import QObject, Qt, Signal, Slot
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QLabel, QMessageBox, QWidget

from app.engine_client import EngineClient
from app.engine_protocol import EngineReady, TaskCancelled, TaskFailed, TaskKind
from app.server.gateway import Deliver, check_payload
from app.task_stream import Task

log = logging.getLogger(__name__)

SERVE_HOST = "127.0.0.1"
SERVE_PORT = 8080


class QtGateway(QObject):
    """The EngineGateway (app/server/gateway.py) of an EngineClient: callable from any thread."""

    _submit = Signal(object)
    _cancel = Signal(object)

    def __init__(self, client: EngineClient, parent: QObject | None = None):
        super().__init__(parent)
        self.client = client
        self._problem = "" if client.info is not None else "the model is loading"
        self._fatal = False
        self._closed = False
        self._submit.connect(self._do_submit, Qt.QueuedConnection)
        self._cancel.connect(self._do_cancel, Qt.QueuedConnection)
        client.ready.connect(self._on_ready)
        client.crashed.connect(self._on_down)
        client.fatal.connect(self._on_fatal)

    # -- EngineGateway (any thread) --
    @property
    def info(self) -> EngineReady | None:
        return self.client.info

    @property
    def state(self) -> str:
        return "ready" if self.client.info is not None else ("fatal" if self._fatal else "loading")

    @property
    def problem(self) -> str:
        return "" if self.client.info is not None else self._problem

    @property
    def document(self):
        return self.client.process.document

    def submit(self, kind: TaskKind, payload: Any, deliver: Deliver) -> Task:
        task = Task(check_payload(kind, payload), payload, deliver, owner=self)
        self._submit.emit(task)
        return task

    def cancel(self, task: Task) -> None:
        self._cancel.emit(task)  # after its submit: one queued connection each, emitted in order

    # -- the GUI thread --
    @Slot(object)
    def _do_submit(self, task: Task) -> None:
        if self._closed:  # queued before the server stopped: run nothing for nobody
            task.deliver(TaskFailed(0, "EngineError", "The server was stopped."))
        else:
            self.client.submit_task(task)

    @Slot(object)
    def _do_cancel(self, task: Task) -> None:
        task.cancel()

    def abandon_all(self, message: str = "the server was stopped") -> None:
        """Cancel every task of the server and tell the server at once (GUI thread): a stop that waited
        for the engine's answers would wait for this very thread, which delivers them."""
        self._closed = True
        for task in self.client.pending():
            if task.owner is self:
                task.cancel()
                task.deliver(TaskCancelled(task.id, message))  # its end: what the engine sends later is dropped

    @Slot(object)
    def _on_ready(self, _info) -> None:
        self._fatal, self._problem = False, ""

    @Slot(str)
    def _on_down(self, message: str) -> None:
        self._problem = message

    @Slot(str)
    def _on_fatal(self, message: str) -> None:
        self._fatal, self._problem = True, message


class ServeSwitch(QObject):
    """A checkable action ("Serve on localhost:8080") and a status-bar label with the address."""

    def __init__(self, client: EngineClient, parent: QWidget, *, host: str = SERVE_HOST, port: int = SERVE_PORT):
        super().__init__(parent)
        self.host, self.port = host, port
        self.client = client
        self.gateway: QtGateway | None = None
        self.server = None
        self.action = QAction(f"Serve on localhost:{port}", self)
        self.action.setCheckable(True)
        self.action.setToolTip("Serve this engine with the OpenAI API on this machine only (docs/SERVER.md)")
        self.action.toggled.connect(self.set_serving)
        self.label = QLabel("")
        self.label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.label.setVisible(False)

    @property
    def url(self) -> str | None:
        return f"{self.server.url}/v1" if self.server is not None else None

    @Slot(bool)
    def set_serving(self, on: bool) -> None:
        if on and self.server is None:
            from app.server.runner import LocalServer, ServerConfigError
            from app.server.schema import Defaults

            self.gateway = QtGateway(self.client, self)
            try:
                self.server = LocalServer(self.gateway, defaults=Defaults(), host=self.host,
                                          port=self.port).start()
            except ServerConfigError as exc:
                self.gateway.deleteLater()
                self.gateway = None
                self.action.setChecked(False)
                QMessageBox.warning(self.parent(), "Serve", str(exc))
                return
            self.label.setText(f"Serving {self.url}")
            self.label.setToolTip("OpenAI-compatible: GET /v1/models, POST /v1/chat/completions, /v1/completions")
            self.label.setVisible(True)
        elif not on:
            self.stop()

    def stop(self) -> None:
        """Stop serving (open streams end, their tasks are cancelled). Safe to call twice."""
        server, self.server = self.server, None
        gateway, self.gateway = self.gateway, None
        if gateway is not None:
            gateway.abandon_all()
        if server is not None:
            server.stop()
        if gateway is not None:
            gateway.deleteLater()
        self.label.setVisible(False)
        if self.action.isChecked():
            self.action.blockSignals(True)
            self.action.setChecked(False)
            self.action.blockSignals(False)
