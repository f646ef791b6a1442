"""The Generation section: how answers are sampled, and how long they may be, for the model shown.

One set per model file: `set_model` shows the model's defaults (its file's recommendation, else the
app's: backend/sampling.py) or what the user changed for it. This section is the one writer of
Settings.generation (file name -> values; nothing while they are the model's defaults), saved once the
spin boxes rest; a model with nothing saved gets Settings.max_tokens as its answer length.
"""
from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import (
    QDoubleSpinBox,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
)

from app.settings import Settings
from backend.sampling import RANGES, SamplingParams, model_defaults, numeric_fields

MAX_TOKENS_RANGE = (8, 8192)  # as the Settings dialog's answer room
SAVE_AFTER_MS = 500
SEED_MAX = 2**31 - 1  # QSpinBox holds a C int

# field -> (label, step, decimals, tooltip); decimals 0 = a whole number
ROWS = {
    "temperature": ("Temperature", 0.05, 2, "0 = greedy: the most likely token every time"),
    "top_k": ("Top-k", 1, 0, "keep the k most likely tokens (0 = off)"),
    "top_p": ("Top-p", 0.01, 3, "keep the most likely tokens that make up this share (1 = off)"),
    "min_p": ("Min-p", 0.01, 3, "drop tokens less likely than this share of the top one (0 = off)"),
    "repeat_penalty": ("Repeat penalty", 0.01, 2, "make tokens seen in the window less likely (1 = off)"),
    "repeat_last_n": ("Penalty window", 16, 0, "the answer's last tokens the penalties look back on (0 = off)"),
    "presence_penalty": ("Presence penalty", 0.05, 2, "OpenAI's: once per token seen (0 = off)"),
    "frequency_penalty": ("Frequency penalty", 0.05, 2, "OpenAI's: per time a token was seen (0 = off)"),
    "dry_multiplier": ("DRY multiplier", 0.05, 2, "DRY: make a token that would go on repeating what the answer "
                       "said less likely, the more so the longer the repeat (0 = off)"),
    "dry_base": ("DRY base", 0.05, 2, "DRY: how fast its penalty grows with each token of a repeat"),
    "dry_allowed_length": ("DRY allowed length", 1, 0, "DRY: a repeat of up to this many tokens is free"),
    "dry_penalty_last_n": ("DRY window", 16, 0, "the answer's last tokens DRY looks back on (0 = off)"),
    "seed": ("Seed", 1, 0, "the draw; 'random' = a new one per question (both runs of a comparison share it)"),
}


class GenerationSettings(QGroupBox):
    changed = Signal()  # a value changed, or another model is shown (applies to the next question)

    def __init__(self, settings: Settings, parent=None):
        super().__init__("Generation", parent)
        self.settings = settings
        self.model_name = ""  # the model file shown
        self._recommended: tuple = ()
        self._defaults = SamplingParams()
        self._breakers = self._defaults.dry_sequence_breakers
        self._default_max_tokens = settings.max_tokens
        self._save_soon = QTimer(self)
        self._save_soon.setSingleShot(True)
        self._save_soon.setInterval(SAVE_AFTER_MS)
        self._save_soon.timeout.connect(self._save)
        self.boxes: dict[str, QSpinBox | QDoubleSpinBox] = {}
        grid = QGridLayout()
        for i, (name, (label, step, decimals, tip)) in enumerate(ROWS.items()):
            box = self._box(name, step, decimals)
            box.setToolTip(tip)
            self.boxes[name] = box
            grid.addWidget(QLabel(label), i // 2, 2 * (i % 2))
            grid.addWidget(box, i // 2, 2 * (i % 2) + 1)
        self.max_tokens_box = QSpinBox()
        self.max_tokens_box.setRange(*MAX_TOKENS_RANGE)
        self.max_tokens_box.setSingleStep(64)
        self.max_tokens_box.setToolTip("the longest answer, in tokens (also the room kept for it in the context)")
        n = len(ROWS)
        grid.addWidget(QLabel("Max answer tokens"), n // 2, 2 * (n % 2))
        grid.addWidget(self.max_tokens_box, n // 2, 2 * (n % 2) + 1)
        self.source = QLabel()
        self.source.setWordWrap(True)
        self.source.setStyleSheet("color: #777; font-size: 11px")
        self.reset_btn = QPushButton("Model defaults")
        self.reset_btn.clicked.connect(self.reset)
        bottom = QHBoxLayout()
        bottom.addWidget(self.source, 1)
        bottom.addWidget(self.reset_btn)
        lay = QVBoxLayout(self)
        lay.addLayout(grid)
        lay.addLayout(bottom)
        for box in (*self.boxes.values(), self.max_tokens_box):
            box.valueChanged.connect(self._on_change)

    @staticmethod
    def _box(name: str, step: float, decimals: int):
        lo, hi = RANGES[name]
        if decimals:
            box = QDoubleSpinBox()
            box.setDecimals(decimals)
            box.setRange(lo, hi if hi is not None else 1e6)
        else:
            box = QSpinBox()
            box.setRange(int(lo), int(hi) if hi is not None else (SEED_MAX if name == "seed" else 100_000))
        box.setSingleStep(step)
        if name == "seed":
            box.setSpecialValueText("random")  # shown at the minimum, RANDOM_SEED
        elif name in ("repeat_last_n", "dry_penalty_last_n"):
            box.setSpecialValueText("whole answer")  # -1
        return box

    # -- the model shown --
    def set_model(self, model_name: str, recommended: tuple = ()) -> None:
        """Show model file `model_name`: what was saved for it, else its defaults (`recommended`: its
        file's recommended sampling, ModelInfo.sampling)."""
        self.model_name, self._recommended = model_name, recommended
        defaults, source = model_defaults(dict(recommended))
        self._defaults, self._default_max_tokens = self._as_shown(defaults), self.settings.max_tokens
        self.source.setText(f"Defaults: {source}.")
        saved = self.settings.generation.get(model_name) or {}
        shown = SamplingParams.from_dict(saved, defaults)
        self._breakers = shown.dry_sequence_breakers  # not in a box: a saved set or the defaults
        self._set(shown, saved.get("max_tokens", self._default_max_tokens))
        self.changed.emit()

    def reload(self) -> None:
        """Show the same model again (after the Settings dialog changed the default answer length)."""
        self.set_model(self.model_name, self._recommended)

    @staticmethod
    def _as_shown(params: SamplingParams) -> SamplingParams:
        """`params` as the boxes can show them (rounded to their decimals), so defaults compare equal."""
        return replace(params, **{name: round(getattr(params, name), decimals)
                                  for name, (_, _, decimals, _) in ROWS.items() if decimals})

    def reset(self) -> None:
        self._breakers = self._defaults.dry_sequence_breakers
        self._set(self._defaults, self._default_max_tokens)
        self._on_change()

    def _set(self, params: SamplingParams, max_tokens) -> None:
        for box in (*self.boxes.values(), self.max_tokens_box):
            box.blockSignals(True)
        for name, box in self.boxes.items():
            box.setValue(getattr(params, name))
        lo, hi = MAX_TOKENS_RANGE
        self.max_tokens_box.setValue(max_tokens if isinstance(max_tokens, int) and lo <= max_tokens <= hi
                                     else self._default_max_tokens)
        for box in (*self.boxes.values(), self.max_tokens_box):
            box.blockSignals(False)
        self._mark()

    # -- what the next question gets --
    def params(self) -> SamplingParams:
        shown = {f.name: self.boxes[f.name].value() for f in numeric_fields()}
        return self._as_shown(SamplingParams(**shown, dry_sequence_breakers=self._breakers))

    def max_tokens(self) -> int:
        return self.max_tokens_box.value()

    def saved(self) -> dict | None:
        """What to save for this model: every value, or None while they are all the model's defaults."""
        if self.params() == self._defaults and self.max_tokens() == self._default_max_tokens:
            return None
        return {**self.params().as_dict(), "max_tokens": self.max_tokens()}

    def _on_change(self, *_) -> None:
        self._mark()
        saved = self.saved()
        if saved is None:
            self.settings.generation.pop(self.model_name, None)
        else:
            self.settings.generation[self.model_name] = saved
        self._save_soon.start()
        self.changed.emit()

    def _save(self) -> None:
        try:
            self.settings.save()
        except OSError:  # a read-only config folder: the values still hold for this session
            pass

    def _mark(self) -> None:
        self.reset_btn.setEnabled(self.saved() is not None)
