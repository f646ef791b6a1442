"""The recall tab: needle recall on the attached document (or a built-in haystack) at chosen lengths and
depths, exact and RidgeFill side by side as heatmaps, accuracy per region, McNemar p, cancel, export."""
from __future__ import annotations

import json
from pathlib import Path

from PySide6.QtCore import Slot
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.engine_client import TaskHandle
from app.engine_protocol import RecallRequest, RecallResult, RecallRow, TaskKind
from backend.protocol import ProgressEvent
from ui.heatmap import Heatmap, fmt_acc, fmt_p


def parse_list(text: str, kind=float) -> list:
    out = []
    for part in text.replace(";", ",").split(","):
        part = part.strip().lower()
        if not part:
            continue
        mult = 1024 if part.endswith("k") else 1
        out.append(kind(float(part.rstrip("k")) * mult) if kind is int else kind(part))
    return out


class RecallPanel(QWidget):
    def __init__(self, service, controls, chat, parent=None):
        super().__init__(parent)
        self.service, self.controls, self.chat = service, controls, chat
        self._task: TaskHandle | None = None
        self.request: RecallRequest | None = None
        self.rows: list[dict] = []
        self.result: RecallResult | None = None

        self.lengths = QLineEdit("1024, 2048")
        self.depths = QLineEdit("0.1, 0.3, 0.5, 0.7, 0.9")
        self.haystack = QComboBox()
        self.haystack.addItem("the attached document", "document")
        self.haystack.addItem("built-in prose corpus", "corpus")
        self.haystack.addItem("repeated filler (RULER)", "filler")
        self.reps = QSpinBox()
        self.reps.setRange(1, 20)
        self.run_btn = QPushButton("Run recall")
        self.cancel_btn = QPushButton("Cancel")
        self.cancel_btn.setEnabled(False)
        self.export_btn = QPushButton("Export JSON…")
        self.export_btn.setEnabled(False)
        self.progress = QProgressBar()
        self.progress.setVisible(False)
        self.status = QLabel("Each cell: a needle (a 7-digit number) hidden at that depth of a prompt of that length; "
                             "the model must repeat it. Exact and RidgeFill answer the same items.")
        self.status.setWordWrap(True)
        self.exact_map = Heatmap("Exact")
        self.rf_map = Heatmap("RidgeFill")
        self.summary = QLabel()
        self.summary.setWordWrap(True)

        form = QFormLayout()
        form.addRow("Lengths (tokens)", self.lengths)
        form.addRow("Depths (0–1)", self.depths)
        form.addRow("Haystack", self.haystack)
        form.addRow("Repeats per cell", self.reps)
        buttons = QHBoxLayout()
        for b in (self.run_btn, self.cancel_btn, self.export_btn):
            buttons.addWidget(b)
        buttons.addStretch(1)
        maps = QHBoxLayout()
        maps.addWidget(self.exact_map)
        maps.addWidget(self.rf_map)
        lay = QVBoxLayout(self)
        lay.addLayout(form)
        lay.addLayout(buttons)
        lay.addWidget(self.progress)
        lay.addWidget(self.status)
        lay.addLayout(maps, 1)
        lay.addWidget(self.summary)

        self.run_btn.clicked.connect(self.run)
        self.cancel_btn.clicked.connect(self.cancel)
        self.export_btn.clicked.connect(self.choose_export)

    def ridgefill_mode(self) -> str:
        mode = self.controls.mode()
        return mode if mode != "off" else self.controls.mode_box.currentData()

    @Slot()
    def run(self) -> bool:
        if self._task is not None:
            return False
        try:
            lengths = parse_list(self.lengths.text(), int)
            depths = parse_list(self.depths.text(), float)
        except ValueError:
            self.status.setText("Lengths are token counts (1024 or 1k), depths shares between 0 and 1, separated by commas.")
            return False
        if not lengths or not depths or any(not 0 <= d <= 1 for d in depths):
            self.status.setText("Give at least one length and one depth between 0 and 1.")
            return False
        source = self.haystack.currentData()
        # the chat's documents, one after the other, are the haystack
        docs = [] if self.chat.loading else self.chat.conv.documents  # texts still being read: the corpus
        doc = "\n\n".join(d.text.strip() for d in docs) if source == "document" and docs else None
        if source == "document" and doc is None:
            source = "corpus"
        mode = self.ridgefill_mode()
        split, tail = self.controls.split(), self.controls.tail()
        self.request = RecallRequest(lengths=lengths, depths=depths, modes=["off", mode], split=split, tail=tail,
                                     document=doc, extra={"haystack": source, "reps": self.reps.value()})
        self.rows, self.result = [], None
        self.exact_map.set_grid(lengths, depths, tail)
        self.rf_map.title = f"RidgeFill ({mode}, split {split}, tail {tail:,})"
        self.rf_map.set_grid(lengths, depths, tail)
        self.summary.setText("")
        self._task = self.service.submit(TaskKind.RECALL, self.request, owner=self, on_event=self._on_event,
                                         on_done=self._on_result, on_failed=self._on_failed,
                                         on_cancelled=self._on_cancelled)
        self.run_btn.setEnabled(False)
        self.cancel_btn.setEnabled(True)
        self.export_btn.setEnabled(False)
        self.progress.setVisible(True)
        self.progress.setRange(0, 0)
        self.status.setText("Building the needle items…")
        return True

    @Slot()
    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()  # this run only; the chat's answer (if any) goes on

    # ---- the run's events (one run at a time: run() refuses a second) ----------------------------
    def _on_event(self, ev) -> None:
        if isinstance(ev, RecallRow):
            r = ev.row
            self.rows.append(r)
            target = self.exact_map if r["mode"] == "off" else self.rf_map
            target.add(r["length"], r["depth"], r["correct"], r["region"])
            self.progress.setRange(0, ev.total)
            self.progress.setValue(ev.done)
            note = f" · {r['note']}" if r.get("note") else ""
            self.status.setText(f"{ev.done} / {ev.total} answers · last: {r['mode']} at {r['length']:,} tokens, "
                                f"depth {r['depth']:.0%}: {'✓' if r['correct'] else '✗'}{note}")
        elif isinstance(ev, ProgressEvent) and ev.stage == "recall":
            self.progress.setRange(0, ev.total)
            self.progress.setValue(ev.done)

    def _on_result(self, res: RecallResult) -> None:
        self._task = None
        self.result = res
        self.rows = list(res.rows)  # resumed answers (from an earlier identical run) included
        self.exact_map.set_grid(self.request.lengths, self.request.depths, self.request.tail)
        self.rf_map.set_grid(self.request.lengths, self.request.depths, self.request.tail)
        for r in self.rows:
            (self.exact_map if r["mode"] == "off" else self.rf_map).add(r["length"], r["depth"], r["correct"], r["region"])
        self._show_summary(res.summary)
        ran = {r.get("mode_run") for r in res.rows if r["mode"] != "off"}
        if ran == {"off"}:
            notes = {r["note"] for r in res.rows if r.get("note")}
            self.status.setText("Done, but RidgeFill did not run on these items (so both sides are exact): "
                                + " ".join(sorted(notes))[:400])
        else:
            self.status.setText(f"Done: {len(res.rows)} answers.")
        self._end()

    def _show_summary(self, s: dict) -> None:
        acc, modes = s["accuracy"], s["modes"]
        lines = []
        for m in modes:
            name = "Exact" if m == "off" else f"RidgeFill ({m})"
            lines.append(f"<b>{name}</b>: bulk {fmt_acc(acc.get(f'{m}/bulk'))} · tail {fmt_acc(acc.get(f'{m}/tail'))}"
                         f" · all {fmt_acc(acc.get(f'{m}/all'))}")
        if "paired" in s:
            p = s["paired"]
            lines.append(f"McNemar (exact vs RidgeFill, {p['n']} paired items): p = {fmt_p(p['p_mcnemar'])} · "
                         f"only exact right {p['a_only']}, only RidgeFill right {p['b_only']}"
                         + (f" · bulk only: p = {fmt_p(s['paired_bulk']['p_mcnemar'])}" if s.get("paired_bulk") else ""))
        self.summary.setText("<br>".join(lines))

    def _on_failed(self, etype: str, message: str) -> None:
        self._task = None
        self.status.setText(f"Recall run failed: {message}")
        self._end()

    def _on_cancelled(self, message: str) -> None:
        self._task = None
        self.status.setText(f"Cancelled ({message}); the cells done so far stay.")
        self._end()

    def _end(self) -> None:
        self.progress.setVisible(False)
        self.run_btn.setEnabled(True)
        self.cancel_btn.setEnabled(False)
        self.export_btn.setEnabled(bool(self.rows))

    @Slot()
    def choose_export(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export recall results", "recall.json", "JSON (*.json)")
        if path:
            self.export(path)

    def export(self, path: str | Path) -> Path:
        req = self.request
        data = {"lengths": req.lengths, "depths": req.depths, "modes": req.modes, "split": req.split,
                "tail": req.tail, "complete": self.result is not None,
                "summary": self.result.summary if self.result else None, "rows": self.rows}
        p = Path(path)
        p.write_text(json.dumps(data, indent=1), encoding="utf-8")
        return p

    def shutdown(self) -> None:
        self.cancel()
