"""Write build/ram-desktop.ico (16-256 px) from resources/ram-desktop.png for Inno Setup.

NOT RUN HERE (needs Pillow, which the Linux build does not install):
    pip install pillow==<pinned version>
    python packaging/windows/make-ico.py
"""

from pathlib import Path

from PIL import Image

root = Path(__file__).resolve().parents[2]
out = root / "build" / "ram-desktop.ico"
out.parent.mkdir(exist_ok=True)
Image.open(root / "resources" / "ram-desktop.png").save(out, sizes=[(s, s) for s in (16, 24, 32, 48, 64, 128, 256)])
print(out)
