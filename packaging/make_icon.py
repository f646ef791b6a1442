"""Draw the app icon with Qt's QPainter and write PNGs (and an .ico) into a folder.

Usage: python packaging/make_icon.py OUT_DIR
A document page with ridge lines and a fill arrow: the product's name, drawn, not downloaded.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

SIZES = (16, 24, 32, 48, 64, 128, 256, 512)


def draw(size: int):
    from PySide6.QtCore import QPointF, QRectF, Qt
    from PySide6.QtGui import QColor, QImage, QLinearGradient, QPainter, QPainterPath, QPen

    img = QImage(size, size, QImage.Format.Format_ARGB32)
    img.fill(Qt.GlobalColor.transparent)
    p = QPainter(img)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    s = size / 256.0
    # rounded tile with a blue-teal gradient
    grad = QLinearGradient(0, 0, 0, size)
    grad.setColorAt(0.0, QColor("#2b6cb0"))
    grad.setColorAt(1.0, QColor("#0f766e"))
    p.setPen(Qt.PenStyle.NoPen)
    p.setBrush(grad)
    p.drawRoundedRect(QRectF(8 * s, 8 * s, 240 * s, 240 * s), 48 * s, 48 * s)
    # the document page
    p.setBrush(QColor("#f8fafc"))
    p.drawRoundedRect(QRectF(56 * s, 40 * s, 144 * s, 176 * s), 14 * s, 14 * s)
    # text lines: the prompt
    pen = QPen(QColor("#94a3b8"), max(1.0, 8 * s), Qt.PenStyle.SolidLine, Qt.PenCapStyle.RoundCap)
    p.setPen(pen)
    for i, width in enumerate((104, 88, 104, 72)):
        y = (72 + 22 * i) * s
        p.drawLine(QPointF(76 * s, y), QPointF((76 + width) * s, y))
    # the ridge: a mountain line filled below, the "fill" of RidgeFill
    ridge = QPainterPath(QPointF(56 * s, 200 * s))
    for x, y in ((56, 182), (96, 150), (122, 170), (156, 128), (200, 164), (200, 200)):
        ridge.lineTo(QPointF(x * s, y * s))
    ridge.closeSubpath()
    p.setPen(Qt.PenStyle.NoPen)
    p.setBrush(QColor("#f59e0b"))
    p.drawPath(ridge)
    p.end()
    return img


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtGui import QGuiApplication, QImageWriter

    app = QGuiApplication.instance() or QGuiApplication(["make_icon"])  # noqa: F841 (fonts, plugins)
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    for size in SIZES:
        if not draw(size).save(str(out / f"ridgefill-{size}.png"), "PNG"):
            print(f"could not write {size}px icon", file=sys.stderr)
            return 1
    # Windows wants an .ico; Qt's ico plugin writes one image per file, which Windows accepts.
    if b"ico" in [bytes(f) for f in QImageWriter.supportedImageFormats()]:
        draw(256).save(str(out / "ridgefill.ico"), "ICO")
    print(f"icons written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
