"""Models and maps: HUB's catalogue with one-click download (progress, cancel, fit hints), "open local
GGUF", and the map sets on disk for the current model."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.paths import cache_dir, data_dir
from backend.hub import catalogue as cat
from backend.hub import maps_hub, store
from backend.hub.downloads import download_model
from backend.hub.fit import check_fit
from backend.hub.jobs import DownloadEvent, DownloadJob
from backend.hub.settings import HubSettings
from ui.background import BackgroundJob

USER_MODELS = "user_models.json"  # the same file as `python -m app models --add`


def _size(b: int | None) -> str:
    return "?" if not b else (f"{b / 1e9:.2f} GB" if b >= 1e9 else f"{b / 1e6:.0f} MB")


class ModelsPanel(QWidget):
    open_model = Signal(str)  # a verified GGUF path to run

    def __init__(self, service, settings, parent=None):
        super().__init__(parent)
        self.service, self.settings = service, settings
        self.entries: list[cat.ModelEntry] = []
        self._job: BackgroundJob | None = None
        self._dl: DownloadJob | None = None

        self.table = QTableWidget(0, 6)
        self.table.setHorizontalHeaderLabels(["Model", "Architecture", "Quant", "Size", "State", "Fits this machine"])
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.Stretch)
        self.download_btn = QPushButton("Download")
        self.use_btn = QPushButton("Use this model")
        self.cancel_btn = QPushButton("Cancel")
        self.cancel_btn.setEnabled(False)
        self.open_btn = QPushButton("Open local GGUF…")
        self.progress = QProgressBar()
        self.progress.setVisible(False)
        self.state = QLabel()
        self.state.setWordWrap(True)
        self.maps_title = QLabel("<b>Map sets for the current model</b>")
        self.maps = QLabel()
        self.maps.setWordWrap(True)
        self.maps.setTextInteractionFlags(Qt.TextSelectableByMouse)

        row = QHBoxLayout()
        for b in (self.download_btn, self.use_btn, self.cancel_btn, self.open_btn):
            row.addWidget(b)
        row.addStretch(1)
        lay = QVBoxLayout(self)
        lay.addWidget(self.table, 1)
        lay.addLayout(row)
        lay.addWidget(self.progress)
        lay.addWidget(self.state)
        lay.addWidget(self.maps_title)
        lay.addWidget(self.maps)

        self.download_btn.clicked.connect(self.download_selected)
        self.use_btn.clicked.connect(self.use_selected)
        self.cancel_btn.clicked.connect(self.cancel)
        self.open_btn.clicked.connect(self.choose_local)
        self.table.itemSelectionChanged.connect(self._on_select)
        # A bound slot, not a lambda: Qt drops it when this widget is deleted before the service.
        service.ready.connect(self._on_engine_ready)
        self.refresh()

    def hub_settings(self) -> HubSettings:
        s = self.settings
        return HubSettings(cache_root=Path(s.cache_location) if s.cache_location else cache_dir(),
                           endpoint=s.hub_endpoint or None, token=s.hub_token or None)

    # ---- catalogue -------------------------------------------------------------------------------
    @Slot(object)
    def _on_engine_ready(self, _info) -> None:
        self.refresh()

    def refresh(self) -> None:
        hs = self.hub_settings()
        try:
            self.entries = cat.load_catalogue(data_dir() / USER_MODELS)
        except Exception as exc:  # noqa: BLE001 - a broken catalogue must not take the app down
            self.state.setText(f"The catalogue could not be read: {exc}")
            self.entries = []
        self.table.setRowCount(len(self.entries))
        for r, e in enumerate(self.entries):
            path = store.model_path(e, hs)
            state = "embedded" if e.embedded else ("installed" if path else ("local" if e.local_path else "not downloaded"))
            fit = "" if path else check_fit(e.size_bytes or 0, hs.models_dir).summary()
            for c, text in enumerate([e.name, e.architecture, e.quantization, _size(e.size_bytes), state, fit]):
                item = QTableWidgetItem(text)
                item.setToolTip(e.notes or text)
                self.table.setItem(r, c, item)
        self.table.resizeColumnsToContents()
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.Stretch)
        self._show_maps()
        self._on_select()

    def selected(self) -> cat.ModelEntry | None:
        rows = self.table.selectionModel().selectedRows()
        return self.entries[rows[0].row()] if rows else None

    def _on_select(self) -> None:
        e = self.selected()
        busy = self._job is not None and self._job.running()
        installed = e is not None and store.model_path(e, self.hub_settings()) is not None
        self.download_btn.setEnabled(e is not None and not installed and e.on_hub and not busy)
        self.use_btn.setEnabled(installed)

    def _current_entry(self) -> cat.ModelEntry | None:
        info = self.service.info
        if info is None:
            return None
        hs = self.hub_settings()
        for e in self.entries:
            p = store.model_path(e, hs)
            if p is not None and Path(p).resolve() == Path(info.model_path).resolve():
                return e
        return None

    def _show_maps(self) -> None:
        info = self.service.info
        if info is None:
            self.maps.setText("(the engine is starting)")
            return
        try:
            sets = maps_hub.local_map_sets(Path(info.model_path), self.hub_settings())
        except Exception as exc:  # noqa: BLE001
            self.maps.setText(f"Map sets cannot be listed: {exc}")
            return
        lines = [f"split {s}: {v.status}" + (f" ({'; '.join(v.reasons)})" if v.reasons else "") + f" — {v.folder}"
                 for s, v in sorted(sets.items())]
        entry = self._current_entry()
        hint = maps_hub.fit_hint(entry, info.default_split, Path(info.model_path)) if entry else \
            "Fit a map set locally with “Fit maps for this split” (RidgeFill panel)."
        self.maps.setText("\n".join(lines or ["No verified map set on disk for this model."]) + "\n" + hint)

    # ---- actions ---------------------------------------------------------------------------------
    @Slot()
    def download_selected(self) -> None:
        e = self.selected()
        if e is not None:
            self._start(f"model {e.name}", lambda job, hs: download_model(e, hs, job))

    def download_maps_for(self, info, split: int) -> None:
        """The RidgeFill panel's "Download maps": the current model's map set at `split`."""
        entry = self._current_entry()
        if entry is None or info is None:
            self.state.setText("This model is not in the catalogue, so no map set can be downloaded for it; "
                               "fit one locally with “Fit maps for this split”.")
            return
        self._start(f"maps for {entry.name}, split {split}",
                    lambda job, hs: maps_hub.download_maps(entry, split, Path(info.model_path), hs, job))

    def _start(self, label: str, run) -> None:
        if self._job is not None and self._job.running():
            self.state.setText("A download is already running; cancel it first.")
            return
        hs = self.hub_settings()
        self._dl = DownloadJob(label)
        dl = self._dl

        def fn(emit):
            dl.on_event = emit
            return run(dl, hs)

        self._job = BackgroundJob(fn, dl.cancel, self)
        self._job.event.connect(self._on_event)
        self._job.done.connect(self._on_done)
        self._job.failed.connect(self._on_failed)
        self.progress.setVisible(True)
        self.progress.setRange(0, 0)
        self.cancel_btn.setEnabled(True)
        self.state.setText(f"{label}: starting…")
        self._job.start()
        self._on_select()

    @Slot(object)
    def _on_event(self, ev: DownloadEvent) -> None:
        if ev.total:
            self.progress.setRange(0, 1000)
            self.progress.setValue(int(1000 * ev.done / ev.total))
        rate = ev.done / ev.elapsed_s / 1e6 if ev.elapsed_s > 0 else 0.0
        self.state.setText(f"{ev.label}: {ev.state.value} · {ev.done / 1e6:,.1f}"
                           + (f" / {ev.total / 1e6:,.1f}" if ev.total else "") + f" MB · {rate:,.1f} MB/s"
                           + (f" · {ev.file}" if ev.file else ""))

    @Slot(object)
    def _on_done(self, path) -> None:
        self.progress.setVisible(False)
        self.cancel_btn.setEnabled(False)
        warn = f" Warnings: {'; '.join(self._dl.warnings)}" if self._dl and self._dl.warnings else ""
        self.state.setText(f"Ready: {path}.{warn}")
        self.refresh()

    @Slot(str, str)
    def _on_failed(self, etype: str, message: str) -> None:
        self.progress.setVisible(False)
        self.cancel_btn.setEnabled(False)
        self.state.setText(f"Failed: {message}")
        self._on_select()

    @Slot()
    def cancel(self) -> None:
        if self._dl is not None:
            self._dl.cancel()

    @Slot()
    def use_selected(self) -> None:
        e = self.selected()
        p = store.model_path(e, self.hub_settings()) if e else None
        if p is not None:
            self.open_model.emit(str(p))

    @Slot()
    def choose_local(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open a GGUF model", "", "GGUF models (*.gguf);;All files (*)")
        if path:
            self.add_local(path)

    def add_local(self, path: str) -> bool:
        try:
            cat.add_local(path, data_dir() / USER_MODELS)
        except Exception as exc:  # noqa: BLE001 - ModelFileError / HubError carry the reason
            self.state.setText(f"Not added: {exc}")
            return False
        self.refresh()
        self.open_model.emit(path)
        return True

    def shutdown(self) -> None:
        if self._job is not None:
            self._job.stop()
