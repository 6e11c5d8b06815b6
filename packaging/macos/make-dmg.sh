#!/usr/bin/env bash
# Build "RAM Desktop.app" and a .dmg on macOS. NOT BUILT OR TESTED (written on Linux).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
VENV=build/pyinstaller-venv
[[ "$(uname -s)" == Darwin ]] || { echo "error: run this on macOS" >&2; exit 2; }

[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -c constraints.txt -c packaging/constraints-build.txt \
    pyinstaller pyinstaller-hooks-contrib setuptools torch safetensors huggingface_hub pyyaml tqdm numpy xxhash \
    PySide6_Essentials pyqtgraph pillow
"$VENV/bin/python" -m pip install --no-deps --no-build-isolation --force-reinstall .
VERSION=$(cd /tmp && "$OLDPWD/$VENV/bin/python" -c 'import ram_desktop; print(ram_desktop.__version__)')
"$VENV/bin/python" -m PyInstaller --noconfirm --distpath dist --workpath build/pyinstaller packaging/ram-desktop.spec

APP="dist/RAM Desktop.app"
"$APP/Contents/MacOS/ram-merge" --version

STAGE=build/dmg
rm -rf "$STAGE" && mkdir -p "$STAGE"
cp -R "$APP" "$STAGE/"
ln -s /Applications "$STAGE/Applications"
DMG="dist/ram-desktop-$VERSION-macos-$(uname -m).dmg"
rm -f "$DMG"
hdiutil create -volname "RAM Desktop $VERSION" -srcfolder "$STAGE" -fs HFS+ -format UDZO -ov "$DMG"
rm -rf "$STAGE"
echo "$DMG"
