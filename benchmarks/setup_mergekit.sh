#!/usr/bin/env bash
# Make a separate virtual environment with mergekit for the benchmarks (never inside the repo).
#
#   benchmarks/setup_mergekit.sh [VENV_DIR]      (default /work/mergekit-venv)
#
# torch is pinned (TORCH_VERSION, default 2.13.0, a CPU build on this machine's index) and installed
# first, and mergekit is installed with a constraints file holding that pin, so pip cannot replace
# it with a CUDA build of several GB.  Tested: mergekit 0.1.5 from PyPI (it has `ram`, `ramplus_tl`,
# `ties`, `dare_ties`, `task_arithmetic`, `dare_linear`, `linear`).
set -euo pipefail

VENV="${1:-/work/mergekit-venv}"
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
MERGEKIT_VERSION="${MERGEKIT_VERSION:-0.1.5}"

case "$(realpath -m "$VENV")" in
  "$(realpath -m "$(dirname "$0")/..")"*) echo "error: put the mergekit venv outside the repository" >&2; exit 2;;
esac

"$PYTHON" -m venv "$VENV"
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
echo "torch==${TORCH_VERSION}" > "$CONSTRAINTS"

"$VENV/bin/pip" install --upgrade pip
"$VENV/bin/pip" install "torch==${TORCH_VERSION}"
"$VENV/bin/pip" install -c "$CONSTRAINTS" "mergekit==${MERGEKIT_VERSION}"

"$VENV/bin/python" - <<'EOF'
import importlib.metadata as m
import torch
from mergekit.merge_methods import registry
names = sorted(x.spec.name for x in registry.registered_methods())
print("mergekit", m.version("mergekit"), "torch", torch.__version__, "cuda build:", torch.version.cuda)
need = {"ram", "ramplus_tl", "ties", "dare_ties", "task_arithmetic", "dare_linear", "linear", "slerp", "nuslerp",
        "multislerp", "karcher", "model_stock", "breadcrumbs", "breadcrumbs_ties", "della", "della_linear", "sce",
        "nearswap", "arcee_fusion"}
missing = need - set(names)
print("merge methods:", ", ".join(names))
if missing:
    raise SystemExit(f"error: this mergekit lacks {sorted(missing)}")
EOF
echo "mergekit-yaml: $VENV/bin/mergekit-yaml"
