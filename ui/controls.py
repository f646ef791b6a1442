"""RidgeFill controls: on/off, mode, split slider over the layers, exact tail, compare, maps status.

The modes offered are backend.protocol's RIDGEFILL_MODES (the toggle is "off"); the layer count and
the default split and tail come from the model (ui/main_window.py: show_model), never from here.
"""
from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QSlider,
    QSpinBox,
    QVBoxLayout,
)

from backend.protocol import RIDGEFILL_MODES
from backend.ridgefill.defaults import DEFAULT_MODE, MIN_TAIL

# How each mode is named in the mode box; a mode without a label here is shown by its name.
MODE_LABELS = {
    "speed": "speed (ridge maps)",
    "quality": "quality (speed, names and numbers exact)",
    "guided": "guided (speed, rows the question attends to exact)",
    "plumb": "plumb (oracle check)",
}

SETTLE_MS = 250  # the slider rests this long on a split before its maps are checked

STATUS_STYLE = {
    "verified": ("Maps verified ✓", "color: #2e7d32"),
    "warning": ("Maps usable, with a warning", "color: #b26a00"),
    "refused": ("Maps refused: runs exact", "color: #c62828"),
    "missing": ("No maps for this split: runs exact", "color: #c62828"),
    "unavailable": ("Maps could not be checked: runs exact", "color: #777"),
    "checking": ("Checking maps…", "color: #777"),
}


class RidgeFillControls(QGroupBox):
    changed = Signal()  # mode, split or tail changed (applies to the next request)
    split_settled = Signal(int)  # the slider rested on a split: check its maps
    get_maps = Signal(int)  # cached, else the published set, else fitted here (backend/hub/get_maps.py)
    tune = Signal()
    cancel_fit = Signal()

    def __init__(self, parent=None):
        super().__init__("RidgeFill", parent)
        self.n_layer = 0  # no model yet: set_model gives the layers and the defaults
        self.model_defaults: tuple[int, int] | None = None  # the shown model's default (split, tail)
        self._local: tuple | None = None  # while a server's model is shown: this machine's, to show again
        self._build_widgets()
        self._lay_out()
        self._connect()
        self._update_label()
        self._on_change()

    def _build_widgets(self) -> None:
        self.toggle = QCheckBox("Skip late layers for bulk rows (RidgeFill)")
        self.toggle.setChecked(True)
        self.exact_by_default = False  # the shown model's tune chose exact (set_model)
        self.mode_box = QComboBox()
        for mode in RIDGEFILL_MODES:
            self.mode_box.addItem(MODE_LABELS.get(mode, mode), mode)
        self.mode_box.setCurrentIndex(self.mode_box.findData(DEFAULT_MODE))
        self.slider = QSlider(Qt.Horizontal)
        self.slider.setTickPosition(QSlider.TicksBelow)
        self.slider.setTickInterval(1)
        self.slider.setPageStep(1)
        self.split_label = QLabel()
        self.split_label.setWordWrap(True)
        self.tail_spin = QSpinBox()
        self.tail_spin.setRange(MIN_TAIL, 131072)
        self.tail_spin.setSingleStep(64)  # the default tail (defaults.DEFAULT_TAIL) and its multiples
        self.tail_spin.setSuffix(" tokens")
        self.compare = QCheckBox("Compare with exact (runs the exact model too)")
        self.maps_label = QLabel()
        self.maps_label.setWordWrap(True)
        self.maps_reasons = QLabel()
        self.maps_reasons.setWordWrap(True)
        self.maps_reasons.setStyleSheet("color: #777; font-size: 11px")
        self._build_fit_widgets()

    def _build_fit_widgets(self) -> None:
        """Get maps, Tune, and the progress bar with Cancel that either shows while it runs."""
        self.get_btn = QPushButton("Get maps")
        self.get_btn.setToolTip("Maps for this split: the published set when there is one (verified), otherwise "
                                "fitted here from activations captured once per model (resumable).")
        self.tune_btn = QPushButton("Tune for this model")
        self.tune_btn.setToolTip("Measure a few splits (recall against exact, TTFT) and make the lowest that "
                                 "keeps recall this model's default (about 10 minutes).")
        self.tuned_label = QLabel()
        self.tuned_label.setWordWrap(True)
        self.tuned_label.setVisible(False)
        self.untuned_label = QLabel()  # while the model's split is a guess (app/model_tuning.py)
        self.untuned_label.setWordWrap(True)
        self.untuned_label.setStyleSheet("color: #b26a00")
        self.untuned_label.setVisible(False)
        self.fit_bar = QProgressBar()
        self.fit_bar.setVisible(False)
        self.fit_cancel = QPushButton("Cancel")
        self.fit_cancel.setVisible(False)

    def _lay_out(self) -> None:
        form = QFormLayout()
        form.addRow("Mode", self.mode_box)
        form.addRow("Split", self.slider)
        form.addRow("", self.split_label)
        form.addRow("Exact tail", self.tail_spin)
        buttons = QHBoxLayout()
        buttons.addWidget(self.get_btn)
        buttons.addWidget(self.tune_btn)
        fit_row = QHBoxLayout()
        fit_row.addWidget(self.fit_bar, 1)
        fit_row.addWidget(self.fit_cancel)
        lay = QVBoxLayout(self)
        lay.addWidget(self.toggle)
        lay.addLayout(form)
        lay.addWidget(self.compare)
        lay.addWidget(self.maps_label)
        lay.addWidget(self.maps_reasons)
        lay.addWidget(self.tuned_label)
        lay.addWidget(self.untuned_label)
        lay.addLayout(buttons)
        lay.addLayout(fit_row)

    def _connect(self) -> None:
        self._settle = QTimer(self)
        self._settle.setSingleShot(True)
        self._settle.setInterval(SETTLE_MS)
        self._settle.timeout.connect(self._settled)
        self.toggle.toggled.connect(self._on_change)
        self.mode_box.currentIndexChanged.connect(self._on_change)
        self.mode_box.currentIndexChanged.connect(self._update_label)
        self.slider.valueChanged.connect(self._on_split)
        self.tail_spin.valueChanged.connect(self._on_change)
        self.get_btn.clicked.connect(lambda: self.get_maps.emit(self.split()))
        self.tune_btn.clicked.connect(self.tune)
        self.fit_cancel.clicked.connect(self.cancel_fit)

    # -- model --
    def set_default_mode(self, mode: str) -> None:
        """The mode the shown model runs by default: a RidgeFill mode in the box, or "off" (its tune chose
        exact: RidgeFill stays one click away, switched off; switched on again for the next model)."""
        self.mode_box.blockSignals(True)
        shown = DEFAULT_MODE if mode == "off" else mode  # switched on, it runs what defaults.switched_on_mode says
        if self.mode_box.findData(shown) >= 0:
            self.mode_box.setCurrentIndex(self.mode_box.findData(shown))
        self.mode_box.blockSignals(False)
        was_exact, self.exact_by_default = self.exact_by_default, mode == "off"
        if self.exact_by_default or was_exact:
            self.toggle.setChecked(not self.exact_by_default)

    def set_model(self, n_layer: int, split: int, tail: int, min_tail: int, mode: str | None) -> None:
        """The model's layers, the split and tail to show (its defaults or the user's saved values) and
        the mode it runs by default (None: unchanged)."""
        self.n_layer = n_layer
        if mode is not None:
            self.set_default_mode(mode)
        self.tail_spin.setMinimum(min_tail)
        self.slider.blockSignals(True)
        self.slider.setRange(1, max(1, n_layer - 1))
        self.slider.setValue(min(max(1, split), n_layer - 1))
        self.slider.blockSignals(False)
        self.tail_spin.blockSignals(True)
        self.tail_spin.setValue(tail)
        self.tail_spin.blockSignals(False)
        self._update_label()
        self._on_change()

    def show_remote(self, n_layer: int, split: int, tail: int) -> None:
        """The controls follow a model on this app's server elsewhere (its layers, default split and tail);
        the maps line, Get maps and Tune, which act on this machine, hide until show_local."""
        if self._local is None:  # the toggle too: a model that runs exact by default has it off, or the user's choice
            self._local = (self.n_layer, self.split(), self.tail(), self.tail_spin.minimum(), self.mode_box.currentData(),
                           self.toggle.isChecked(), self.exact_by_default)
        self._show_local_parts(False)
        self.set_model(n_layer, split, tail, MIN_TAIL, None)

    def show_local(self) -> None:
        """This machine's model again, as it was before a server's was shown."""
        if self._local is not None:
            local, self._local = self._local, None
            self.set_model(*local[:5])
            self.exact_by_default = local[6]
            self.toggle.setChecked(local[5])
        self._show_local_parts(True)

    def _show_local_parts(self, shown: bool) -> None:
        for w in (self.maps_label, self.maps_reasons, self.get_btn, self.tune_btn):
            w.setVisible(shown)
        self.tuned_label.setVisible(shown and bool(self.tuned_label.text()))
        self.untuned_label.setVisible(shown and bool(self.untuned_label.text()))

    def showing_remote(self) -> bool:
        """Whether a server's model is shown (its maps and its tune are the server's, not this machine's)."""
        return self._local is not None

    def _settled(self) -> None:
        if self._local is None:  # a server's split: its maps are the server's, not this machine's to check
            self.split_settled.emit(self.split())

    # -- what the next request gets --
    def mode(self) -> str:
        return self.mode_box.currentData() if self.toggle.isChecked() else "off"

    def split(self) -> int:
        return self.slider.value()

    def tail(self) -> int:
        return self.tail_spin.value()

    def asked_split(self) -> int | None:
        """The split a request asks for: None while the slider shows the model's default (the engine
        resolves it: backend/ridgefill/defaults.py), else the user's."""
        return None if self.model_defaults and self.split() == self.model_defaults[0] else self.split()

    def asked_tail(self) -> int | None:
        """The tail a request asks for: None at the model's default, else the user's."""
        return None if self.model_defaults and self.tail() == self.model_defaults[1] else self.tail()

    # -- maps --
    def set_maps_status(self, status: str, reasons: list[str] | None = None) -> None:
        text, style = STATUS_STYLE.get(status, (status, ""))
        self.maps_status = status
        self.maps_label.setText(f"{text} (split {self.split()})")
        self.maps_label.setStyleSheet(style)
        self.maps_reasons.setText("\n".join(reasons or []))
        self.maps_reasons.setVisible(bool(reasons))
        self.get_btn.setEnabled(status not in ("verified", "warning") and not self.fit_bar.isVisible())

    def set_tuned(self, text: str) -> None:
        """The tuned setting's line ("speed at S = 11, worst of …", or "exact (…)"); "" hides it."""
        if text and not text.lower().startswith("tuned"):
            text = f"Tuned: {text}"
        self.tuned_label.setText(text[:1].upper() + text[1:])
        self.tuned_label.setVisible(bool(text) and not self.showing_remote())

    def set_untuned(self, note: str) -> None:
        """The note that the split is a guess ("untuned: split 20 is a guess …"); "" hides it."""
        self.untuned_label.setText(note[:1].upper() + note[1:])
        self.untuned_label.setVisible(bool(note) and not self.showing_remote())

    def set_fit_progress(self, done: int, total: int, label: str) -> None:
        self.fit_bar.setVisible(True)
        self.fit_cancel.setVisible(True)
        self.get_btn.setEnabled(False)
        self.tune_btn.setEnabled(False)
        self.fit_bar.setRange(0, max(1, total))
        self.fit_bar.setValue(done)
        self.fit_bar.setFormat(label)

    def fit_finished(self) -> None:
        self.fit_bar.setVisible(False)
        self.fit_cancel.setVisible(False)
        self.get_btn.setEnabled(getattr(self, "maps_status", "") not in ("verified", "warning"))
        self.tune_btn.setEnabled(True)

    # -- internals --
    def _on_split(self) -> None:
        self._update_label()
        self._settle.start()
        self._on_change()

    def _update_label(self) -> None:
        if self.n_layer < 2:
            self.split_label.setText("(no model)")
            return
        s, last = self.split(), self.n_layer - 1
        text = f"S = {s}: layers {s}–{last} predicted for bulk rows; layers 0–{s - 1} exact"
        if self.mode_box.currentData() == "speed" and self.model_defaults and s < self.model_defaults[0]:
            # speed below a measured split loses the needles guided keeps (docs/USAGE.md#defaults-per-model)
            text += f". Below S = {self.model_defaults[0]}, use guided: speed loses what the question needs"
        self.split_label.setText(text)

    def _on_change(self, *_) -> None:
        on = self.toggle.isChecked()
        for w in (self.mode_box, self.slider, self.tail_spin):
            w.setEnabled(on and self.n_layer >= 2)
        self.changed.emit()
