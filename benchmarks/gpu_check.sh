#!/usr/bin/env bash
# The GPU check for a lease (benchmarks/gpu_check.py): one command that ends within 9 minutes on one H200 from a
# bare machine, writing gpu-check.json and gpu-check.log under $OUT. DEV=cpu is its dry run on the tiny layouts
# (tests/test_gpu_check.py runs it in CI). Wheels the device image lacks (mergekit 0.1.5 and what it needs) travel
# in .whl (benchmarks/gpu_wheels.sh makes them, then checks the carry here: reproduction/real/carry.py --plan
# gpu-check, the tree and .whl within 64 MiB); without them the mergekit rows are skipped.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:=/tmp/gpu-check}" "${DEV:=cuda}"
mkdir -p "$OUT"
PY=${PYTHON:-python3}
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  if [ -z "${RAM_MERGEKIT:-}" ]; then
    printf '#!/bin/sh\nexec %s -c "from mergekit.scripts.run_yaml import main; main()" "$@"\n' "$PY" >/tmp/site/mergekit-yaml
    chmod +x /tmp/site/mergekit-yaml
    export RAM_MERGEKIT=/tmp/site/mergekit-yaml
  fi
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
"$PY" benchmarks/gpu_check.py --device "$DEV" --out "$OUT" "$@"
