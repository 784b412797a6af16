"""Render tessera/resources/icons/tessera.svg to the PNG sizes desktops ask for
(tessera/resources/icons/tessera-<N>.png).

Run after editing the SVG: `QT_QPA_PLATFORM=offscreen python packaging/render_icons.py`. Uses Qt's SVG renderer
(PySide6-Essentials ships QtSvg), so no extra tool is needed; the PNGs are committed so installing needs no Qt step.
"""

from __future__ import annotations

import sys
from pathlib import Path

ICONS = Path(__file__).resolve().parent.parent / "tessera" / "resources" / "icons"
SIZES = (16, 24, 32, 48, 64, 128, 256, 512)


def render(svg: Path = ICONS / "tessera.svg", out_dir: Path = ICONS, sizes=SIZES) -> list[Path]:
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    _app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])  # QPainter needs one
    renderer = QSvgRenderer(str(svg))
    if not renderer.isValid():
        raise SystemExit(f"error: {svg}: not a valid SVG")
    written = []
    for n in sizes:
        image = QImage(n, n, QImage.Format.Format_ARGB32_Premultiplied)
        image.fill(Qt.GlobalColor.transparent)
        painter = QPainter(image)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        renderer.render(painter)
        painter.end()
        path = out_dir / f"tessera-{n}.png"
        if not image.save(str(path)):
            raise SystemExit(f"error: {path}: could not write")
        written.append(path)
    return written


if __name__ == "__main__":
    for p in render():
        print(p)
