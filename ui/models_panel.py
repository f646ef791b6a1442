"""Models and maps: HUB's catalogue with one-click download (progress, cancel, fit hints), "open local
GGUF", and the map sets on disk for every installed model (the current one first).

Everything that touches the disk or the network (reading the catalogue and what is installed, the
disk/memory fit, hashing map folders, downloads, adding a local file) runs as a background job
(ui/background.py) with its own callbacks and cancel; the GUI thread only shows the results. The
functions that run in a job are the plain ones at the top: they never touch a widget.
"""
from __future__ import annotations

import html
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

from app.engine_client import TaskHandle
from app.job_runner import JobContext
from backend.errors import Cancelled
from backend.hub import catalogue as cat
from backend.hub import maps_hub
from backend.hub.downloads import download_model
from backend.hub.jobs import DownloadEvent, DownloadJob
from backend.hub.recommend import recommended_model
from backend.hub.settings import HubSettings
from backend.hub.status import model_rows
from ui.background import BackgroundJobs

def _size(b: int | None) -> str:
    return "?" if not b else (f"{b / 1e9:.2f} GB" if b >= 1e9 else f"{b / 1e6:.0f} MB")


def _context(n: int | None) -> str:
    """A context length as people write it: 8K, 32K, 128K tokens."""
    return "?" if not n else (f"{n // 1024}K" if n % 1024 == 0 else f"{n:,}")


# ---- the work, run in background jobs (no widgets) -----------------------------------------------
def read_catalogue(hs: HubSettings) -> tuple[list[cat.ModelEntry], list[dict]]:
    """The catalogue and, per entry, what is installed and whether it fits (backend.hub.status)."""
    entries = cat.load_catalogue(cat.user_models_file())
    return entries, model_rows(entries, hs)


def _state(entry: cat.ModelEntry, row: dict) -> str:
    if entry.embedded:
        return "embedded"
    if row["path"]:
        return "installed"
    return "local" if entry.local_path else "not downloaded"


def installed_models(entries: list[cat.ModelEntry], rows: list[dict],
                     current_path: str | None) -> list[tuple[cat.ModelEntry | None, str]]:
    """(entry, file) of every installed model, the current one first; a current model that is not in
    the catalogue comes as (None, file). `rows` are backend.hub.status.model_rows; a file not on disk (the
    embedded Gemma before it is first opened and assembled) is left out."""
    current = Path(current_path).resolve() if current_path else None
    found = [(e, r["path"]) for e, r in zip(entries, rows) if r["path"] and Path(r["path"]).is_file()]
    first = [m for m in found if current is not None and Path(m[1]).resolve() == current]
    if current is not None and not first:
        first = [(None, str(current_path))]
    return first + [m for m in found if m not in first]


def map_sets_text(models: list[tuple[cat.ModelEntry | None, str]], current_path: str | None,
                  default_split: int | None, hs: HubSettings, cancelled=lambda: False) -> str:
    """The usable map sets on disk for each model (each folder verified: sha256 of its files, then the
    model's fingerprint), one block per model; the current model's block ends with a fitting hint."""
    current = Path(current_path).resolve() if current_path else None
    blocks = []
    for entry, path in models:
        if cancelled():
            raise Cancelled("map listing cancelled")
        is_current = current is not None and Path(path).resolve() == current
        title = (entry.name if entry else Path(path).name) + (" — current model" if is_current else "")
        try:
            sets = maps_hub.local_map_sets(Path(path), hs)
            lines = [f"split {s}: {v.status}" + (f" ({'; '.join(v.reasons)})" if v.reasons else "")
                     + f" — {v.folder}" for s, v in sorted(sets.items())] or ["No verified map set on disk."]
        except Exception as exc:  # noqa: BLE001 - a listing that fails says why; it must not break the panel
            lines = [f"Map sets cannot be listed: {exc}"]
        if is_current:
            lines.append(maps_hub.fit_hint(entry, default_split, Path(path)) if entry else
                         "Fit a map set locally with “Get maps” (RidgeFill panel).")
        blocks.append("\n".join([title] + ["  " + line for line in lines]))
    return "\n".join(blocks) if blocks else "No model is installed."


def _download(ctx: JobContext, label: str, hs: HubSettings, run) -> tuple[str, list[str], tuple]:
    """A hub download as a job: the DownloadJob reports through ctx and stops on ctx's cancel.
    Returns (path, warnings, the catalogue read again), so the table is current when "Ready" shows."""
    dl = DownloadJob(label, on_event=ctx.emit)
    ctx.on_cancel(dl.cancel)
    path = run(dl)
    return str(path), list(dl.warnings), read_catalogue(hs)


# ---- the panel -----------------------------------------------------------------------------------
class ModelsPanel(QWidget):
    open_model = Signal(str)  # a verified GGUF path to run

    def __init__(self, service, settings, parent=None):
        super().__init__(parent)
        self.service, self.settings = service, settings
        self.entries: list[cat.ModelEntry] = []
        self.rows: list[dict] = []  # backend.hub.status.model_rows, one per entry
        self.jobs = BackgroundJobs(self)
        self._job: TaskHandle | None = None  # the download (one at a time)
        self._refresh_task: TaskHandle | None = None
        self._maps_task: TaskHandle | None = None
        self.recommended: cat.ModelEntry | None = None  # the model offered for documents (backend.hub.recommend)

        self.recommend_line = QLabel()
        self.recommend_line.setWordWrap(True)
        self.recommend_btn = QPushButton()
        self.table = QTableWidget(0, 7)
        self.table.setHorizontalHeaderLabels(["Model", "Architecture", "Quant", "Size", "Context", "State", "Fits this machine"])
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
        self.maps_title = QLabel("<b>Map sets of the installed models</b>")
        self.maps = QLabel()
        self.maps.setTextFormat(Qt.PlainText)
        self.maps.setWordWrap(True)
        self.maps.setTextInteractionFlags(Qt.TextSelectableByMouse)

        offer = QHBoxLayout()
        offer.addWidget(self.recommend_line, 1)
        offer.addWidget(self.recommend_btn)
        row = QHBoxLayout()
        for b in (self.download_btn, self.use_btn, self.cancel_btn, self.open_btn):
            row.addWidget(b)
        row.addStretch(1)
        lay = QVBoxLayout(self)
        lay.addLayout(offer)
        lay.addWidget(self.table, 1)
        lay.addLayout(row)
        lay.addWidget(self.progress)
        lay.addWidget(self.state)
        lay.addWidget(self.maps_title)
        lay.addWidget(self.maps)

        self.recommend_btn.clicked.connect(self.download_recommended)
        self.download_btn.clicked.connect(self.download_selected)
        self.use_btn.clicked.connect(self.use_selected)
        self.cancel_btn.clicked.connect(self.cancel)
        self.open_btn.clicked.connect(self.choose_local)
        self.table.itemSelectionChanged.connect(self._on_select)
        # A bound slot, not a lambda: Qt drops it when this widget is deleted before the service.
        service.ready.connect(self._on_engine_ready)
        self._on_select()
        self.refresh()

    def hub_settings(self) -> HubSettings:
        return self.settings.hub_settings()

    # ---- catalogue -------------------------------------------------------------------------------
    @Slot(object)
    def _on_engine_ready(self, _info) -> None:
        self.refresh()

    def refresh(self) -> None:
        """Read the catalogue and the disk in the background, then the map sets of the current model."""
        if self._refresh_task is not None:
            self._refresh_task.cancel()  # its result will be dropped
        hs = self.hub_settings()
        h = self.jobs.submit("catalogue", lambda ctx: read_catalogue(hs), owner=self,
                             on_done=lambda res: self._catalogue_read(h, res),
                             on_failed=lambda _type, message: self._catalogue_failed(h, message),
                             on_cancelled=lambda _message: self._catalogue_failed(h, ""))
        self._refresh_task = h

    def refreshing(self) -> bool:
        return self._refresh_task is not None or self._maps_task is not None

    def _catalogue_read(self, h: TaskHandle, res) -> None:
        if h is not self._refresh_task:
            return
        self._refresh_task = None
        self._show_catalogue(*res)
        self._list_maps()

    def _catalogue_failed(self, h: TaskHandle, message: str) -> None:
        if h is not self._refresh_task:
            return
        self._refresh_task = None
        if message:  # a broken catalogue must not take the app down: say so, keep what is shown
            self.state.setText(f"The catalogue could not be read: {message}")

    def _show_catalogue(self, entries: list[cat.ModelEntry], rows: list[dict]) -> None:
        self.entries, self.rows = entries, rows
        self.table.setRowCount(len(entries))
        for r, (e, row) in enumerate(zip(entries, rows)):
            fit = "" if row["path"] else row["fit"]
            for c, text in enumerate([e.name, e.architecture, e.quantization, _size(e.size_bytes), _context(e.context_length),
                                      _state(e, row), fit]):
                item = QTableWidgetItem(text)
                item.setToolTip(e.notes or text)
                self.table.setItem(r, c, item)
        self.table.resizeColumnsToContents()
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.Stretch)
        self._show_recommendation(recommended_model(entries, rows))
        self._on_select()

    def _show_recommendation(self, entry: cat.ModelEntry | None) -> None:
        """Offer the model for documents while it is not installed; the embedded ones are for trying the app."""
        self.recommended = entry
        row = self.rows[self.entries.index(entry)] if entry is not None else None
        offered = row is not None and not row["path"]
        if offered:
            self.recommend_line.setText(
                f"<b>For your documents on this machine: {html.escape(entry.name)}</b> ({_size(entry.size_bytes)}, "
                f"{_context(entry.context_length)} context, answers questions). The embedded models are for "
                "trying the app.")
            self.recommend_btn.setText(f"Download {entry.name}")
        self.recommend_line.setVisible(offered)
        self.recommend_btn.setVisible(offered)

    def _list_maps(self) -> None:
        """Every installed model's map sets, checked in the background (hashing folders takes a while)."""
        info = self.service.info  # None while the engine starts: no model is marked current yet
        current, split = (info.model_path, info.default_split) if info is not None else (None, None)
        models = installed_models(self.entries, self.rows, current)
        if self._maps_task is not None:
            self._maps_task.cancel()
        hs = self.hub_settings()
        self.maps.setText("Checking the map sets on disk…")
        h = self.jobs.submit("map sets", lambda ctx: map_sets_text(models, current, split, hs, lambda: ctx.cancelled),
                             owner=self, on_done=lambda text: self._maps_listed(h, text),
                             on_failed=lambda _type, message: self._maps_listed(h, f"Map sets cannot be listed: {message}"),
                             on_cancelled=lambda _message: self._maps_listed(h, None))
        self._maps_task = h

    def _maps_listed(self, h: TaskHandle, text: str | None) -> None:
        if h is not self._maps_task:
            return
        self._maps_task = None
        if text is not None:
            self.maps.setText(text)

    def _selected_row(self) -> int | None:
        rows = self.table.selectionModel().selectedRows()
        return rows[0].row() if rows and rows[0].row() < len(self.entries) else None

    def selected(self) -> cat.ModelEntry | None:
        r = self._selected_row()
        return self.entries[r] if r is not None else None

    def _installed_path(self) -> str | None:
        r = self._selected_row()
        return self.rows[r]["path"] if r is not None else None

    def _on_select(self) -> None:
        e = self.selected()
        busy = self._job is not None and self._job.running()
        installed = self._installed_path() is not None
        self.download_btn.setEnabled(e is not None and not installed and e.on_hub and not busy)
        self.recommend_btn.setEnabled(not busy)
        self.use_btn.setEnabled(installed)

    # ---- actions ---------------------------------------------------------------------------------
    @Slot()
    def download_selected(self) -> None:
        e = self.selected()
        if e is not None:
            self._start(f"model {e.name}", lambda dl, hs: download_model(e, hs, dl))

    @Slot()
    def download_recommended(self) -> None:
        """The recommended model, selected in the table (so its progress shows there) and downloaded."""
        if self.recommended is not None:
            self.table.selectRow(self.entries.index(self.recommended))
            self.download_selected()

    def _start(self, label: str, run) -> None:
        if self._job is not None and self._job.running():
            self.state.setText("A download is already running; cancel it first.")
            return
        hs = self.hub_settings()
        self._job = self.jobs.submit(label, lambda ctx: _download(ctx, label, hs, lambda dl: run(dl, hs)), owner=self,
                                     on_event=self._on_event, on_done=self._on_done, on_failed=self._on_failed,
                                     on_cancelled=self._on_cancelled)
        self.progress.setVisible(True)
        self.progress.setRange(0, 0)
        self.cancel_btn.setEnabled(True)
        self.state.setText(f"{label}: starting…")
        self._on_select()

    def _on_event(self, ev: DownloadEvent) -> None:
        if ev.total:
            self.progress.setRange(0, 1000)
            self.progress.setValue(int(1000 * ev.done / ev.total))
        rate = ev.done / ev.elapsed_s / 1e6 if ev.elapsed_s > 0 else 0.0
        self.state.setText(f"{ev.label}: {ev.state.value} · {ev.done / 1e6:,.1f}"
                           + (f" / {ev.total / 1e6:,.1f}" if ev.total else "") + f" MB · {rate:,.1f} MB/s"
                           + (f" · {ev.file}" if ev.file else "") + (f" · {ev.note}" if ev.note else ""))

    def _on_done(self, res) -> None:
        path, warnings, catalogue = res
        self._end()
        self._show_catalogue(*catalogue)
        self._list_maps()
        self.state.setText(f"Ready: {path}." + (f" Warnings: {'; '.join(warnings)}" if warnings else ""))

    def _on_failed(self, etype: str, message: str) -> None:
        self._end()
        self.state.setText(f"Failed: {message}")

    def _on_cancelled(self, message: str) -> None:
        self._end()
        self.state.setText(f"Failed: cancelled by you; nothing was kept ({message})")

    def _end(self) -> None:
        self.progress.setVisible(False)
        self.cancel_btn.setEnabled(False)
        self._on_select()

    @Slot()
    def cancel(self) -> None:
        if self._job is not None:
            self._job.cancel()

    @Slot()
    def use_selected(self) -> None:
        p = self._installed_path()
        if p is not None:
            self.open_model.emit(str(p))

    @Slot()
    def choose_local(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open a GGUF model", "", "GGUF models (*.gguf);;All files (*)")
        if path:
            self.add_local(path)

    def add_local(self, path: str) -> TaskHandle:
        """Check the file and add it to the user's catalogue (in the background), then open it."""
        hs = self.hub_settings()

        def work(ctx):
            cat.add_local(path, cat.user_models_file())  # reads the GGUF; ModelFileError says what is wrong
            return read_catalogue(hs)

        def added(catalogue) -> None:
            self._show_catalogue(*catalogue)
            self._list_maps()
            self.open_model.emit(path)

        self.state.setText(f"Checking {Path(path).name}…")
        return self.jobs.submit("add local model", work, owner=self, on_done=added,
                                on_failed=lambda _type, message: self.state.setText(f"Not added: {message}"))

    def shutdown(self) -> None:
        self.jobs.shutdown()
