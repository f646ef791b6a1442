"""The main window: conversations on the left, tabs (chat, recall, models) in the middle,
RidgeFill controls and the TTFT chart on the right, engine state in the status bar."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Slot
from PySide6.QtGui import QAction
from PySide6.QtWidgets import (
    QDockWidget,
    QFileDialog,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QMessageBox,
    QPushButton,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.conversations import ConversationStore, Summary
from app.engine_client import EngineClient
from app.engine_protocol import EngineReady, EngineSettings, TaskKind
from app.model_tuning import model_tuning, untuned_note_of_ready
from app.settings import RunOverrides, Settings
from backend.embedded_models import embedded_model_path, is_embedded_model
from backend.errors import ModelFileError
from backend.json_file import notices
from backend.model_file import read_model_header
from backend.ridgefill.defaults import MIN_TAIL, default_mode, default_split, default_tail
from ui.chat_panel import ChatPanel
from ui.controls import RidgeFillControls
from ui.maps_tasks import MapsTasks
from ui.engine_picker import EnginePicker
from ui.format import engine_ready_line
from ui.generation_settings import GenerationSettings
from ui.models_panel import ModelsPanel
from ui.recall_panel import RecallPanel
from ui.serve_switch import ServeSwitch
from ui.settings_dialog import SettingsDialog
from ui.ttft_chart import TtftChart


class MainWindow(QMainWindow):
    def __init__(self, settings: Settings, service: EngineClient, store: ConversationStore | None = None,
                 *, owns_service: bool = True, overrides: RunOverrides | None = None):
        super().__init__()
        self.settings = settings
        self.overrides = overrides or RunOverrides()  # this run's command line, never saved
        self.service = service
        self.owns_service = owns_service  # tests share one engine between windows
        self.store = store or ConversationStore()
        self.setWindowTitle("RidgeFill Desktop")
        self.resize(1280, 820)
        self._shown_model: tuple[str, int] | None = None  # (resolved path, n_layer) the controls show

        self._build_tabs()
        self._build_docks()
        self.engine_label = QLabel("Starting the engine…")
        self.statusBar().addWidget(self.engine_label, 1)
        self.document_label = QLabel("")  # the prompt the engine holds: "document 4,110 tokens, 62% exact"
        self.statusBar().addPermanentWidget(self.document_label)
        self._build_menu()
        self._connect()
        self._show_saved_state()

    def _build_tabs(self) -> None:
        """The RidgeFill controls (set from the model file before the first frame) and the three tabs."""
        self.controls = RidgeFillControls()
        self.generation = GenerationSettings(self.settings)  # sampling and answer length, per model
        self.models = ModelsPanel(self.service, self.settings)
        self.maps_tasks = MapsTasks(self.service, self.controls, self.models, self.settings, self)  # check, Get maps, Tune
        self.show_model(self.service.settings.model_path)  # the model's real layers and defaults, first frame
        self.chart = TtftChart()
        self.chat = ChatPanel(self.service, self.store, self.controls, self.chart, max_tokens=self.settings.max_tokens)
        self._use_generation()
        self.tabs = QTabWidget()
        self.tabs.addTab(self.chat, "Chat")
        self.recall = RecallPanel(self.service, self.controls, self.chat)
        self.tabs.addTab(self.recall, "Recall")
        self.tabs.addTab(self.models, "Models && maps")
        self.setCentralWidget(self.tabs)

    def _build_docks(self) -> None:
        """Conversations on the left; the RidgeFill controls, the Generation section and the TTFT chart on the right."""
        self.conv_list = QListWidget()
        self._summaries: dict[str, Summary] = {}  # what the list shows of each chat, kept up to date in memory
        refresh = QAction("Refresh the list from the data folder", self.conv_list)
        refresh.triggered.connect(self.refresh_conversations)
        self.conv_list.setContextMenuPolicy(Qt.ActionsContextMenu)
        self.conv_list.addAction(refresh)
        self.new_btn = QPushButton("New chat")
        left = QWidget()
        ll = QVBoxLayout(left)
        ll.setContentsMargins(4, 4, 4, 4)
        ll.addWidget(self.new_btn)
        ll.addWidget(self.conv_list, 1)
        dock_left = self._dock("Conversations", "conversations", left, Qt.LeftDockWidgetArea)

        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(4, 4, 4, 4)
        rl.addWidget(EnginePicker(self.chat, self.controls))  # this machine or a server answers the chat
        rl.addWidget(self.controls)
        rl.addWidget(self.generation)
        rl.addWidget(QLabel("Time to first token, this session"))
        rl.addWidget(self.chart, 1)
        dock_right = self._dock("Prefill", "ridgefill", right, Qt.RightDockWidgetArea)
        dock_right.setTitleBarWidget(QWidget())  # the RidgeFill group box titles it already
        self.resizeDocks([dock_left, dock_right], [200, 380], Qt.Horizontal)

    def _dock(self, title: str, name: str, widget: QWidget, area) -> QDockWidget:
        dock = QDockWidget(title)
        dock.setObjectName(name)
        dock.setWidget(widget)
        dock.setFeatures(QDockWidget.DockWidgetMovable)
        self.addDockWidget(area, dock)
        return dock

    def _connect(self) -> None:
        self.service.ready.connect(self._on_ready)
        self.service.crashed.connect(self._on_crashed)
        self.service.fatal.connect(self._on_fatal)
        self.service.document_changed.connect(self._on_document)
        self.maps_tasks.said.connect(self.engine_label.setText)
        self.generation.changed.connect(self._use_generation)
        self.models.open_model.connect(self.open_model)
        self.new_btn.clicked.connect(self.new_conversation)
        self.chat.busy_changed.connect(self._on_chat_busy)
        self.chat.conversation_changed.connect(self._refresh_list)
        self.chat.summaries_read.connect(self._on_summaries)
        self.chat.open_failed.connect(lambda _why: self._refresh_list())
        self.conv_list.currentItemChanged.connect(self._on_pick)

    def _show_saved_state(self) -> None:
        """The saved toggles, the latest conversation, and the engine's state if it already runs."""
        self.controls.toggle.setChecked(self.settings.ridgefill_on and not self.controls.exact_by_default)
        self.controls.compare.setChecked(self.settings.compare_exact)
        if self.settings.first_start:  # the embedded models are for trying the app: show what it recommends
            self.tabs.setCurrentWidget(self.models)
        self._open_latest = True  # once the chats are listed (on the store's writer thread), the latest opens
        self.chat.list_conversations()
        self.store.remove_unused_later()  # the documents of chats deleted while the app was closed
        self._refresh_list()
        if self.service.info is not None:  # a service that is already running (tests share one)
            self._on_ready(self.service.info)
        said = notices(clear=True)  # config files set aside or mended as they were read (json_file.tell)
        if said:
            self.chat.show_notice(" ".join(said))

    @Slot(bool)
    def _on_chat_busy(self, busy: bool) -> None:
        """While documents are read or an answer streams, the chat and its conversation stay shown."""
        if busy:
            self.tabs.setCurrentWidget(self.chat)
        self.conv_list.setEnabled(not busy)
        self.new_btn.setEnabled(not busy)

    def _build_menu(self) -> None:
        m = self.menuBar().addMenu("&File")
        for text, slot, key in [
            ("Attach documents…", self.chat.choose_document, "Ctrl+O"),
            ("Attach a folder of documents…", self.chat.choose_folder, "Ctrl+Shift+D"),
            ("Open local GGUF model…", self.choose_model, "Ctrl+Shift+O"),
            ("Settings…", self.open_settings, "Ctrl+,"),
            ("Quit", self.close, "Ctrl+Q"),
        ]:
            a = QAction(text, self)
            a.setShortcut(key)
            a.triggered.connect(slot)
            m.addAction(a)
        e = self.menuBar().addMenu("&Engine")
        a = QAction("Restart engine", self)
        a.triggered.connect(lambda: self.restart_engine())
        e.addAction(a)
        self.serve = ServeSwitch(self.service, self)  # the OpenAI-compatible server on this engine
        e.addAction(self.serve.action)
        self.statusBar().addPermanentWidget(self.serve.label)

    # ---- conversations ---------------------------------------------------------------------------
    @Slot()
    def new_conversation(self) -> None:
        if self.chat.busy():
            return
        self.chat.new_conversation()
        self.chart.clear()
        self._refresh_list()

    @Slot()
    def refresh_conversations(self) -> None:
        """The list read again from the data folder (another window's chats), off the GUI thread."""
        self.chat.list_conversations()

    @Slot(list)
    def _on_summaries(self, summaries: list) -> None:
        """The chats as the folder holds them; at the window's start, the latest one that reads is opened,
        unless a chat was begun meanwhile."""
        self._summaries = {s.id: s for s in summaries}
        latest, self._open_latest = self._open_latest, False
        untouched = not (self.chat.conv.messages or self.chat.conv.documents or self.chat.busy())
        if latest and summaries and untouched:
            self.chat.open_conversation([s.id for s in summaries], summaries[0].title)
        self._refresh_list()

    @Slot(object)
    def _refresh_list(self, changed=None):
        """The list from the summaries in memory; `changed` (a conversation) updates its own first. The
        folder is read only at start and by refresh_conversations: not each time a chat changes."""
        if changed is not None:
            self._summaries[changed.id] = Summary.of(changed)
        self.conv_list.blockSignals(True)
        self.conv_list.clear()
        convs = sorted(self._summaries.values(), key=lambda s: s.updated, reverse=True)
        if self.chat.conv.id not in self._summaries:
            convs.insert(0, Summary.of(self.chat.conv))
        for c in convs:
            item = QListWidgetItem(c.title)
            item.setData(Qt.UserRole, c.id)
            self.conv_list.addItem(item)
            if c.id == self.chat.conv.id:
                self.conv_list.setCurrentItem(item)
        self.conv_list.blockSignals(False)

    def _on_pick(self, item, _prev) -> None:
        if item is None:
            return
        cid = item.data(Qt.UserRole)
        if cid == self.chat.conv.id:
            return
        if self.chat.open_conversation([cid], item.text()):  # shown at once, read off the GUI thread
            self.chart.clear()

    # ---- the model's layers and defaults -----------------------------------------------------------
    def show_model(self, model_path: str) -> bool:
        """The controls from the model file's header (milliseconds): its layers, and the saved split and tail
        where they fit it, else the model's defaults (backend/ridgefill/defaults.py; the engine reports the same)."""
        try:
            info = read_model_header(model_path or embedded_model_path())
        except ModelFileError as exc:
            self.controls.set_model(0, 1, MIN_TAIL, MIN_TAIL, None)
            self.controls.split_label.setText(str(exc))
            self._shown_model = self.controls.model_defaults = None
            self.maps_tasks.show_tuning("", "")
            return False
        self._apply_model(str(info.path), info.n_layer, default_split(info), default_tail(info),
                          default_mode(info), info.sampling)
        self.maps_tasks.show_tuning(*model_tuning(info))  # the tuned record, read as the split was
        return True

    def _apply_model(self, path: str, n_layer: int, split0: int, tail0: int, mode: str, sampling: tuple) -> None:
        s = self.settings
        split = s.split if 0 < s.split < n_layer else split0
        tail = s.tail if s.tail >= MIN_TAIL else tail0
        self.controls.set_model(n_layer, split, tail, MIN_TAIL, mode)
        self._shown_model = (str(Path(path).resolve()), n_layer)
        self.controls.model_defaults = (split0, tail0)
        self.generation.set_model(Path(path).name, sampling)

    @Slot()
    def _use_generation(self) -> None:
        """The chat's next question gets the Generation section's values."""
        self.chat.sampling = self.generation.params()
        if self.chat.max_tokens != self.generation.max_tokens():
            self.chat.max_tokens = self.generation.max_tokens()
            self.chat.request_count()  # the room kept for the answer changed

    # ---- engine ----------------------------------------------------------------------------------
    @Slot(object)
    def _on_ready(self, info: EngineReady) -> None:
        if self._shown_model != (str(Path(info.model_path).resolve()), info.n_layer):
            # not the model the header said (a file replaced meanwhile): the engine's word wins
            self._apply_model(info.model_path, info.n_layer, info.default_split, info.default_tail,
                              info.default_mode, info.sampling)
            self.maps_tasks.show_tuning(info.tuned, untuned_note_of_ready(info))
        self.engine_label.setText(engine_ready_line(info, is_embedded_model(info.model_path)))
        self.maps_tasks.check(self.controls.split())

    @Slot(object)
    def _on_document(self, status) -> None:
        """The engine's prompt as it is saved and made exact while idle (backend/idle_work.py)."""
        self.document_label.setText(status.line())
        self.document_label.setToolTip(status.note or (
            f"prompt cache: {status.cache_entries} saved, {status.cache_bytes / 1e9:.2f} of "
            f"{status.cache_limit / 1e9:.0f} GB" if status.cache_limit else "prompt cache off"))

    def clear_prompt_cache(self) -> None:
        self.service.submit(TaskKind.CACHE_CLEAR, None, owner=self,
                            on_done=lambda n: self.engine_label.setText(f"Prompt cache cleared ({n} saved prompts)."))

    @Slot(str)
    def _on_crashed(self, message: str) -> None:
        self.engine_label.setText(message)
        self.chat._notice(message)

    @Slot(str)
    def _on_fatal(self, message: str) -> None:
        self.engine_label.setText("Engine stopped: " + message)
        QMessageBox.warning(self, "Engine", message)

    def restart_engine(self, settings: EngineSettings | None = None) -> None:
        self.engine_label.setText("Restarting the engine…")
        self.service.restart(settings or self.overrides.apply(self.settings.engine_settings()))

    @Slot()
    def choose_model(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open a GGUF model", "", "GGUF models (*.gguf);;All files (*)")
        if path:
            self.open_model(path)

    @Slot(str)
    def open_model(self, path: str) -> None:
        try:
            read_model_header(path)  # a clear error here, before the engine tries
        except ModelFileError as exc:
            QMessageBox.warning(self, "Open model", str(exc))
            return
        self.settings.model_path = path
        self.overrides.model_path = None  # the user's choice now
        self.settings.save()
        self.show_model(path)
        self.chart.clear()
        self.restart_engine()

    @Slot()
    def open_settings(self) -> None:
        dlg = SettingsDialog(self.settings, self, clear_cache=self.clear_prompt_cache)
        if dlg.exec():
            restart = dlg.apply()
            self.settings.save()
            self.settings.use_cache_location()
            self.generation.reload()  # the new default answer length
            self.generation.max_tokens_box.setValue(self.settings.max_tokens)  # this model's too: the latest word wins
            if restart:
                self.restart_engine()

    # ---- lifetime --------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Save everything, stop background work and the engine (joined). Safe to call twice."""
        if getattr(self, "_shut", False):
            return
        self._shut = True
        s = self.settings
        if not self.controls.exact_by_default:  # a model whose tune chose exact does not turn RidgeFill off for all
            s.ridgefill_on = self.controls.toggle.isChecked()
        s.compare_exact = self.controls.compare.isChecked()
        if self.controls.model_defaults is not None:  # a value left at the model's default is saved as 0
            s.split, s.tail = self.controls.asked_split() or 0, self.controls.asked_tail() or 0
        try:
            s.save()
        except OSError:
            pass
        try:  # whatever a panel raises, the server and the engine are still stopped
            for panel in (self.chat, self.recall, self.models):
                panel.shutdown()
        finally:
            self.serve.stop()
            if self.owns_service:
                self.service.shutdown()

    def closeEvent(self, e) -> None:
        if not self.chat.save_now() and not self._quit_unsaved():  # waits for the writes still under way
            e.ignore()
            return
        self.shutdown()
        super().closeEvent(e)

    def _quit_unsaved(self) -> bool:
        """True when the user quits anyway although a chat could not be written (a full disk)."""
        answer = QMessageBox.warning(self, "Quit without saving?",
                                     self.chat.unsaved_notice() + "\n\nQuit anyway and lose what was not saved?",
                                     QMessageBox.Yes | QMessageBox.No, QMessageBox.No)
        return answer == QMessageBox.Yes
