"""Settings: threads, context size, answer room, hub endpoint and token, cache location, prompt cache."""
from __future__ import annotations

import os

from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QWidget,
)

from app.settings import Settings


class SettingsDialog(QDialog):
    def __init__(self, settings: Settings, parent=None, *, clear_cache=None):
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.settings = settings
        self.threads = QSpinBox()
        self.threads.setRange(0, os.cpu_count() or 64)
        self.threads.setSpecialValueText("all cores")
        self.threads.setValue(settings.threads)
        self.ctx = QSpinBox()
        self.ctx.setRange(0, 262144)
        self.ctx.setSingleStep(1024)
        self.ctx.setSpecialValueText("auto: follows the document")  # 0 (AUTO_CTX)
        self.ctx.setToolTip("0 (auto): the context grows with the document, up to the model's trained "
                            "context and a K/V cache of a quarter of this machine's RAM")
        self.ctx.setValue(settings.n_ctx)
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(8, 8192)
        self.max_tokens.setValue(settings.max_tokens)
        self.endpoint = QLineEdit(settings.hub_endpoint)
        self.endpoint.setPlaceholderText("https://huggingface.co (default)")
        self.token = QLineEdit(settings.hub_token)
        self.token.setEchoMode(QLineEdit.Password)
        self.token.setPlaceholderText("only for private or gated repositories")
        self.cache = QLineEdit(settings.cache_location)
        self.cache.setPlaceholderText("the platform's user cache folder (default)")
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        cache_row = QHBoxLayout()
        cache_row.addWidget(self.cache, 1)
        cache_row.addWidget(browse)
        cache_w = QWidget()
        cache_w.setLayout(cache_row)
        cache_row.setContentsMargins(0, 0, 0, 0)
        self.prompt_cache = QSpinBox()
        self.prompt_cache.setRange(0, 1000)
        self.prompt_cache.setSuffix(" GB")
        self.prompt_cache.setSpecialValueText("off")
        self.prompt_cache.setValue(settings.prompt_cache_gb)
        self.prompt_cache.setToolTip("Documents prefilled once are kept on disk up to this size; the least "
                                     "recently used go first.")
        self.clear_cache = QPushButton("Clear")
        self.clear_cache.setEnabled(clear_cache is not None)
        if clear_cache is not None:
            self.clear_cache.clicked.connect(clear_cache)
        prompt_row = QHBoxLayout()
        prompt_row.addWidget(self.prompt_cache, 1)
        prompt_row.addWidget(self.clear_cache)
        prompt_row.setContentsMargins(0, 0, 0, 0)
        prompt_w = QWidget()
        prompt_w.setLayout(prompt_row)
        form = QFormLayout(self)
        form.addRow("CPU threads", self.threads)
        form.addRow("Context size (tokens)", self.ctx)
        form.addRow("Room kept for an answer", self.max_tokens)
        form.addRow("Hub endpoint", self.endpoint)
        form.addRow("Hub token", self.token)
        form.addRow("Cache location", cache_w)
        form.addRow("Prompt cache size", prompt_w)
        form.addRow(QLabel("Threads, context size, hub, cache location and prompt cache size restart the engine. "
                           "The theme follows the system."))
        buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)

    def _browse(self) -> None:
        d = QFileDialog.getExistingDirectory(self, "Cache location", self.cache.text())
        if d:
            self.cache.setText(d)

    def apply(self) -> bool:
        """Copy the fields into the settings; True when the engine must restart: the engine process takes
        threads, context size and the cache location (maps, tuned splits, activations) when it starts
        (Settings.engine_settings); a hub change restarts it too, so no task on the old hub goes on."""
        s = self.settings
        before = (s.threads, s.n_ctx, s.hub_endpoint, s.hub_token, s.cache_location, s.prompt_cache_gb)
        s.threads, s.n_ctx, s.max_tokens = self.threads.value(), self.ctx.value(), self.max_tokens.value()
        s.hub_endpoint, s.hub_token = self.endpoint.text().strip(), self.token.text().strip()
        s.cache_location = self.cache.text().strip()
        s.prompt_cache_gb = self.prompt_cache.value()
        return before != (s.threads, s.n_ctx, s.hub_endpoint, s.hub_token, s.cache_location, s.prompt_cache_gb)
