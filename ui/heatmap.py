"""A depth × length accuracy heatmap drawn with QPainter, with the bulk/tail boundary marked.

Rows are needle depths (0 at the top = start of the document), columns are prompt lengths. A cell is
grey until it has results, then red→green by accuracy. The thick dashed line in each column separates
needles in the bulk (approximated rows) from needles in the exact tail.
"""
from __future__ import annotations

import math

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QPainter, QPen
from PySide6.QtWidgets import QSizePolicy, QWidget

from backend.ridgefill.defaults import MIN_BULK


def accuracy_color(acc: float) -> QColor:
    acc = max(0.0, min(1.0, acc))
    return QColor(int(220 * (1 - acc) + 40 * acc), int(60 * (1 - acc) + 170 * acc), int(60 * (1 - acc) + 80 * acc))


class Heatmap(QWidget):
    def __init__(self, title: str = "", parent=None):
        super().__init__(parent)
        self.title = title
        self.lengths: list[int] = []
        self.depths: list[float] = []
        self.cells: dict[tuple[int, float], list[bool]] = {}
        self.regions: dict[tuple[int, float], str] = {}
        self.tail: int | None = None
        self.setMinimumSize(260, 220)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Expanding)

    def set_grid(self, lengths: list[int], depths: list[float], tail: int | None) -> None:
        self.lengths, self.depths, self.tail = sorted(lengths), sorted(depths), tail
        self.cells, self.regions = {}, {}
        self.update()

    def add(self, length: int, depth: float, correct: bool, region: str) -> None:
        self.cells.setdefault((length, depth), []).append(bool(correct))
        self.regions[(length, depth)] = region
        self.update()

    def accuracy(self, length: int, depth: float) -> float | None:
        v = self.cells.get((length, depth))
        return sum(v) / len(v) if v else None

    def filled(self) -> int:
        return len(self.cells)

    def _region(self, length: int, depth: float) -> str:
        if (length, depth) in self.regions:
            return self.regions[(length, depth)]
        if not self.tail:  # before results: the boundary where the exact tail starts, as a share
            return "tail"
        if length - self.tail < MIN_BULK:  # too short for RidgeFill: every row runs exact
            return "tail"
        return "bulk" if depth < (length - self.tail) / length else "tail"

    def paintEvent(self, _e) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.Antialiasing)
        pal = self.palette()
        fg = pal.windowText().color()
        left, top, right, bottom = 52, 26, 8, 34
        w, h = self.width() - left - right, self.height() - top - bottom
        p.setPen(fg)
        f = p.font()
        f.setBold(True)
        p.setFont(f)
        p.drawText(QRectF(0, 0, self.width(), top - 4), Qt.AlignCenter, self.title)
        f.setBold(False)
        f.setPointSizeF(max(7.0, f.pointSizeF() - 1))
        p.setFont(f)
        if not self.lengths or not self.depths:
            p.drawText(QRectF(left, top, w, h), Qt.AlignCenter, "no run yet")
            return
        cw, ch = w / len(self.lengths), h / len(self.depths)
        for ci, L in enumerate(self.lengths):
            x = left + ci * cw
            p.setPen(fg)
            p.drawText(QRectF(x, top + h + 2, cw, 16), Qt.AlignCenter, f"{L:,}")
            for ri, d in enumerate(self.depths):
                y = top + ri * ch
                acc = self.accuracy(L, d)
                rect = QRectF(x + 1, y + 1, cw - 2, ch - 2)
                p.fillRect(rect, accuracy_color(acc) if acc is not None else pal.mid().color())
                if self._region(L, d) == "tail":
                    p.fillRect(rect, QColor(255, 255, 255, 40))
                    p.fillRect(rect, Qt.BDiagPattern)
                if acc is not None:
                    p.setPen(QColor("white"))
                    n = len(self.cells[(L, d)])
                    p.drawText(rect, Qt.AlignCenter, f"{acc:.0%}" + (f"\n{n}" if n > 1 else ""))
            # bulk/tail boundary: between the last bulk depth and the first tail depth in this column
            regions = [self._region(L, d) for d in self.depths]
            for ri in range(1, len(regions)):
                if regions[ri - 1] != regions[ri]:
                    yb = top + ri * ch
                    p.setPen(QPen(fg, 3, Qt.DashLine))
                    p.drawLine(int(x), int(yb), int(x + cw), int(yb))
        p.setPen(fg)
        for ri, d in enumerate(self.depths):
            p.drawText(QRectF(0, top + ri * ch, left - 4, ch), Qt.AlignRight | Qt.AlignVCenter, f"{d:.0%}")
        p.drawText(QRectF(left, top + h + 16, w, 16), Qt.AlignCenter, "prompt length (tokens)  ·  hatched = exact tail")
        p.save()
        p.translate(10, top + h / 2)
        p.rotate(-90)
        p.drawText(QRectF(-h / 2, -8, h, 16), Qt.AlignCenter, "needle depth")
        p.restore()


def fmt_acc(a: dict) -> str:
    if not a or a.get("accuracy") is None:
        return "–"
    return f"{a['correct']}/{a['n']} ({a['accuracy']:.0%})"


def fmt_p(p: float | None) -> str:
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "–"
    return f"{p:.3g}"
