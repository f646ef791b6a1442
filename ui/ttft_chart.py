"""TTFT over the session's messages: one series for RidgeFill answers, one for exact ones (pyqtgraph)."""
from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtWidgets import QVBoxLayout, QWidget

COLORS = {"ridgefill": (230, 126, 34), "exact": (52, 152, 219)}


class TtftChart(QWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.plot = pg.PlotWidget()
        self.plot.setBackground(None)
        self.plot.setLabel("left", "TTFT", units="s")
        self.plot.setLabel("bottom", "message")
        self.plot.showGrid(x=True, y=True, alpha=0.3)
        self.plot.addLegend(offset=(-5, 5))
        self.plot.setMinimumHeight(160)
        self.plot.getAxis("bottom").setTickSpacing(1, 1)  # whole message numbers
        self.points: dict[str, list[tuple[float, float]]] = {"ridgefill": [], "exact": []}
        self.curves = {
            key: self.plot.plot([], [], name=("RidgeFill" if key == "ridgefill" else "exact"),
                                pen=pg.mkPen(COLORS[key], width=2), symbol="o", symbolSize=7,
                                symbolBrush=COLORS[key])
            for key in self.points
        }
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.plot)

    def add(self, message_index: int, ttft_ms: float, mode: str) -> None:
        """A point for one answer, in the series of the mode that actually ran."""
        key = "exact" if mode == "off" else "ridgefill"
        self.points[key].append((float(message_index), ttft_ms / 1000.0))
        xs, ys = zip(*sorted(self.points[key]))
        self.curves[key].setData(list(xs), list(ys))
        # from zero (an honest ratio), with headroom for the legend; whole messages on x
        top = max(y for pts in self.points.values() for _, y in pts)
        n = max(x for pts in self.points.values() for x, _ in pts)
        self.plot.setYRange(0, top * 1.3, padding=0)
        self.plot.setXRange(0.5, n + 0.5, padding=0)

    def n_points(self) -> int:
        return sum(len(v) for v in self.points.values())

    def clear(self) -> None:
        for key in self.points:
            self.points[key] = []
            self.curves[key].setData([], [])
