"""Re-render resources/ram-desktop.png from resources/ram-desktop.svg (needs PySide6 with QtSvg).

QT_QPA_PLATFORM=offscreen python packaging/render-icon.py [SIZE]
"""

import sys
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer

root = Path(__file__).resolve().parent.parent / "resources"
size = int(sys.argv[1]) if len(sys.argv) > 1 else 256
app = QGuiApplication([])
renderer = QSvgRenderer(str(root / "ram-desktop.svg"))
image = QImage(size, size, QImage.Format.Format_ARGB32)
image.fill(Qt.GlobalColor.transparent)
painter = QPainter(image)
painter.setRenderHint(QPainter.RenderHint.Antialiasing)
renderer.render(painter)
painter.end()
out = root / ("ram-desktop.png" if size == 256 else f"ram-desktop-{size}.png")
if not image.save(str(out)):
    sys.exit(f"error: could not write {out}")
print(out)
