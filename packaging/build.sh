#!/usr/bin/env bash
# Build RAM Desktop's Linux packages from a clean checkout:
#
#   dist/ram-desktop/                                 one-folder PyInstaller bundle (ram-desktop + ram-merge)
#   dist/ram-desktop-<version>-linux-x86_64.tar.gz    that folder, packed
#   dist/ram-desktop_<version>_amd64.deb              /opt/ram-desktop, /usr/bin links, .desktop entry, icon
#
# It creates its own build environment (build/pyinstaller-venv) with the pinned runtime dependencies
# (constraints.txt: CPU torch) and the pinned build tools (packaging/constraints-build.txt), and
# reuses it on the next run while those files are unchanged.
#
# Environment:
#   PYTHON=python3.11      interpreter for the build venv (needs its shared libpython; python.org,
#                          Debian and pyenv builds with --enable-shared have it)
#   BUILD_VENV=DIR         build venv location (default build/pyinstaller-venv)
#   PACKAGES=0             build only the bundle, not the .tar.gz and .deb (what CI uses)
#   CLEAN=1                drop PyInstaller's cache and the venv stamp first (a from-scratch build)
#   TORCH_INDEX_URL=URL    extra index for torch: https://download.pytorch.org/whl/cpu on a machine
#                          where PyPI's torch==2.13.0 (the CUDA build on Linux) would be picked;
#                          this machine resolves 2.13.0+cpu from its configured wheels without it
#   ALLOW_CUDA=1           accept a CUDA torch (the CUDA variant; see packaging/README.md)
#   MAX_BUNDLE_MB=1150     fail when the unpacked bundle is larger
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-python3}
VENV=${BUILD_VENV:-build/pyinstaller-venv}
PACKAGES=${PACKAGES:-1}
STAMP=$VENV/.ram-build-stamp
WORK=build/pyinstaller
T0=$(date +%s)

say() { printf '[build %4ss] %s\n' "$(( $(date +%s) - T0 ))" "$*" >&2; }

if [[ "$(uname -s)" != Linux || "$(uname -m)" != x86_64 ]]; then
    echo "error: this script builds the Linux x86_64 packages; see packaging/windows and packaging/macos" >&2
    exit 2
fi

if [[ "${CLEAN:-0}" == 1 ]]; then
    rm -rf "$WORK" "$STAMP"
fi

# --- 1. build environment ------------------------------------------------------------------------
# what the build venv holds (part of its stamp: adding a package here rebuilds an existing venv)
VENV_PACKAGES=(pyinstaller pyinstaller-hooks-contrib setuptools
    torch safetensors huggingface_hub pyyaml tqdm numpy xxhash PySide6_Essentials pyqtgraph
    numba llvmlite transformers tokenizers jinja2 uv)
TORCH_INDEX_ARGS=()
[[ -n "${TORCH_INDEX_URL:-}" ]] && TORCH_INDEX_ARGS=(--extra-index-url "$TORCH_INDEX_URL")
want_stamp=$( (cat constraints.txt packaging/constraints-build.txt pyproject.toml; echo "${TORCH_INDEX_URL:-}"
    echo "${VENV_PACKAGES[*]}") \
    | sha256sum | cut -c1-16)
if [[ ! -x "$VENV/bin/python" || "$(cat "$STAMP" 2>/dev/null)" != "$want_stamp" ]]; then
    say "creating build venv $VENV with $($PYTHON --version 2>&1)"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${TORCH_INDEX_ARGS[@]}" \
        -c constraints.txt -c packaging/constraints-build.txt "${VENV_PACKAGES[@]}"
    echo "$want_stamp" > "$STAMP"
else
    say "reusing build venv $VENV"
fi
PY=$VENV/bin/python
"$PY" -c 'import sysconfig, sys; sys.exit(0 if sysconfig.get_config_var("Py_ENABLE_SHARED") else
    "error: PyInstaller needs a Python built with --enable-shared (set PYTHON=...)")'

# --- 2. the project itself, non-editable ----------------------------------------------------------
say "installing ram-desktop (non-editable) into the build venv"
rm -rf build/lib build/bdist.* ./*.egg-info
"$PY" -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation --force-reinstall \
    -c constraints.txt -c packaging/constraints-build.txt .
rm -rf build/lib build/bdist.* ./*.egg-info
VERSION=$(cd /tmp && "$ROOT/$PY" -c 'import ram_desktop; print(ram_desktop.__version__)')
# numba (the fused CPU kernels) and transformers + tokenizers + jinja2 (`ram-merge eval`) are bundled:
# without numba the frozen engine silently falls back to the slower torch path.
"$PY" -c 'import numba, llvmlite, transformers, tokenizers, jinja2, xxhash' \
    || { echo "error: the build venv lacks numba / transformers / tokenizers / jinja2 / xxhash" >&2; exit 1; }
if "$PY" -c 'import torch, sys; sys.exit(0 if torch.version.cuda is None else 1)'; then :; else
    [[ "${ALLOW_CUDA:-0}" == 1 ]] || { echo "error: the build venv has a CUDA torch; set ALLOW_CUDA=1 for the CUDA variant" >&2; exit 1; }
fi
say "version $VERSION, torch $("$PY" -c 'import torch; print(torch.__version__)')"

# --- 3. PyInstaller -------------------------------------------------------------------------------
say "running PyInstaller on packaging/ram-desktop.spec"
rm -rf dist/ram-desktop
"$PY" -m PyInstaller --noconfirm --log-level WARN \
    --distpath dist --workpath "$WORK" packaging/ram-desktop.spec
ln -sfn ram-desktop dist/ram-desktop/ram-merge  # entry.py runs the CLI when called by this name
BUNDLE_BYTES=$(du -sb dist/ram-desktop | cut -f1)
say "bundle dist/ram-desktop: $(( BUNDLE_BYTES / 1000000 )) MB unpacked"
# the CPU bundle's budget (a CUDA build sets its own): ~1,060 MB with numba's libllvmlite (171 MB)
# and transformers + tokenizers (~65 MB) since they are bundled
MAX_BUNDLE_MB=${MAX_BUNDLE_MB:-1150}
if (( BUNDLE_BYTES >= MAX_BUNDLE_MB * 1000000 )); then
    echo "error: the bundle is over $MAX_BUNDLE_MB MB unpacked" >&2
    exit 1
fi
got=$(dist/ram-desktop/ram-merge --version)
[[ "$got" == "ram-merge $VERSION" ]] || { echo "error: frozen --version said '$got'" >&2; exit 1; }

if [[ "$PACKAGES" != 1 ]]; then
    say "done (bundle only, PACKAGES=$PACKAGES)"
    exit 0
fi

# --- 4. tar.gz ------------------------------------------------------------------------------------
TARBALL=dist/ram-desktop-$VERSION-linux-x86_64.tar.gz
say "packing $TARBALL"
tar -C dist --owner=0 --group=0 --numeric-owner -cf - ram-desktop | gzip -6 > "$TARBALL"

# --- 5. .deb --------------------------------------------------------------------------------------
DEB=dist/ram-desktop_${VERSION}_amd64.deb
STAGE=build/deb/ram-desktop_${VERSION}_amd64
say "staging $DEB"
rm -rf "$STAGE"
mkdir -p "$STAGE/DEBIAN" "$STAGE/opt" "$STAGE/usr/bin" "$STAGE/usr/share/applications" \
    "$STAGE/usr/share/icons/hicolor/256x256/apps" "$STAGE/usr/share/icons/hicolor/scalable/apps" \
    "$STAGE/usr/share/doc/ram-desktop"
cp -a dist/ram-desktop "$STAGE/opt/ram-desktop"
ln -s /opt/ram-desktop/ram-desktop "$STAGE/usr/bin/ram-desktop"
ln -s /opt/ram-desktop/ram-merge "$STAGE/usr/bin/ram-merge"
install -m 644 resources/ram-desktop.desktop "$STAGE/usr/share/applications/ram-desktop.desktop"
install -m 644 resources/ram-desktop.png "$STAGE/usr/share/icons/hicolor/256x256/apps/ram-desktop.png"
install -m 644 resources/ram-desktop.svg "$STAGE/usr/share/icons/hicolor/scalable/apps/ram-desktop.svg"
cat > "$STAGE/usr/share/doc/ram-desktop/copyright" <<EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: ram-desktop
License: Apache-2.0
Comment: bundles CPython, PyTorch (BSD-3-Clause), Qt / PySide6 (LGPL-3.0), pyqtgraph (MIT), NumPy
 (BSD-3-Clause), numba and llvmlite (BSD-2-Clause; LLVM: Apache-2.0 WITH LLVM-exception),
 safetensors, huggingface_hub, transformers, tokenizers and regex (Apache-2.0), Jinja2 and
 MarkupSafe (BSD-3-Clause), xxhash (BSD-2-Clause); their licence files are in /opt/ram-desktop/_internal/*.dist-info.
EOF
chmod -R u+rwX,go+rX,go-w "$STAGE"
INSTALLED_KB=$(du -sk --exclude=DEBIAN "$STAGE" | cut -f1)
# PyInstaller bundles every library the bundle links except the base system (glibc) and the GL / X
# / Wayland client libraries, which must come from the machine (measured with ldd and objdump -T:
# the newest symbol versions used are GLIBC_2.36, GLIBCXX_3.4.30 (libstdc++ is bundled), so the
# package needs Debian 12 / Ubuntu 22.10 or newer). The command line loads no Qt at all.
cat > "$STAGE/DEBIAN/control" <<EOF
Package: ram-desktop
Version: $VERSION
Section: science
Priority: optional
Architecture: amd64
Installed-Size: $INSTALLED_KB
Depends: libc6 (>= 2.36), libgl1, libegl1, libxcb1, libxcb-cursor0, libxcb-icccm4, libxcb-keysyms1,
 libxkbcommon-x11-0
Recommends: libdrm2, libwayland-client0, libwayland-cursor0,
 libwayland-egl1, hicolor-icon-theme, desktop-file-utils
Maintainer: RAM Desktop developers <ram-desktop@users.noreply.github.com>
Homepage: https://arxiv.org/abs/2601.13572
Description: merge RL-trained LLM agents with RAM / RAM+ (desktop app and ram-merge CLI)
 RAM Desktop merges reinforcement-learning-trained agent checkpoints fine-tuned from one base
 model into one generalist model with Reinforced Agent Merging (RAM / RAM+, arXiv 2601.13572)
 or a classic baseline (average, task arithmetic, TIES, DARE), and shows how dense and how
 overlapping the agents' task vectors are. Self-contained: bundles Python, CPU PyTorch and Qt
 under /opt/ram-desktop; evaluates models with transformers (ram-merge eval / compare).
EOF
rm -f "$DEB"
# Packed by hand, not with `dpkg-deb --build`: that archives every folder of the tree, ./opt/ too, and a
# package that ships ./opt/ owns /opt (no Debian package does), so `dpkg -r` warned "directory '/opt'
# not empty so not removed". The data archive lists ./opt/ram-desktop/ and below only; /opt itself
# exists on every FHS system (the preinst creates it where it does not).
(cd "$STAGE" && find opt usr -type f -print0 | sort -z | xargs -0 md5sum) > "$STAGE/DEBIAN/md5sums"
printf '#!/bin/sh\nset -e\n[ -d /opt ] || mkdir -m 755 /opt\n' > "$STAGE/DEBIAN/preinst"
chmod 755 "$STAGE/DEBIAN/preinst"
PACK=build/deb/pack
mkdir -p "$PACK"
printf '2.0\n' > "$PACK/debian-binary"
TAR_ARGS=(--owner=0 --group=0 --numeric-owner --sort=name --format=gnu)
tar -C "$STAGE/DEBIAN" "${TAR_ARGS[@]}" -czf "$PACK/control.tar.gz" ./control ./md5sums ./preinst
tar -C "$STAGE" "${TAR_ARGS[@]}" -cf - ./usr ./opt/ram-desktop | gzip -6 > "$PACK/data.tar.gz"
ar rc "$DEB" "$PACK/debian-binary" "$PACK/control.tar.gz" "$PACK/data.tar.gz"
dpkg-deb --info "$DEB" >/dev/null  # a well-formed package, or stop here
if dpkg-deb -c "$DEB" | awk '{print $NF}' | grep -qx './opt/'; then
    echo "error: $DEB ships ./opt/ itself" >&2
    exit 1
fi
rm -rf build/deb

say "done in $(( $(date +%s) - T0 )) s"
ls -l dist/ram-desktop-"$VERSION"-linux-x86_64.tar.gz "$DEB" >&2
