#!/usr/bin/env bash
# The wheels benchmarks/gpu_check.sh needs on the device image and does not find there (mergekit 0.1.5 for the
# mergekit --cuda rows, and what mergekit imports that the image lacks), downloaded here into .whl/ (ignored by
# git; carried with `carry: [".whl"]`) for the device's Python 3.12 on x86-64 Linux. Then checks, before a lease
# is spent, that the device command's carry (the tree as git copies it and .whl) stays within the 64 MiB a
# command may carry: reproduction/real/carry.py --plan gpu-check, which lists the sizes and exits 1 if not.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-.whl}
mkdir -p "$DEST"
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  -d "$DEST" mergekit==0.1.5 pydantic==2.12.5 pydantic-core==2.41.5 annotated-types==0.7.0 typing-inspection==0.4.2 \
  immutables==0.21
du -sh "$DEST"
if [ "$DEST" = .whl ]; then
  python3 reproduction/real/carry.py --plan gpu-check
else
  python3 reproduction/real/carry.py  # the tree alone: $DEST travels only as .whl
fi
