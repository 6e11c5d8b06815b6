#!/usr/bin/env bash
# CI check of the frozen build, meant to run right after the test suite:
#   1. builds dist/ram-desktop/ with packaging/build.sh (bundle only; reuses build/pyinstaller-venv
#      and PyInstaller's cache when present; PACKAGES=1 to also make the .tar.gz and .deb),
#   2. runs the frozen executable with an empty environment and no Python on PATH
#      (env -i PATH=<empty dir>): --bundle-check (Qt offscreen, icons, pyqtgraph, chart export), demo, merge, probe through the ram-desktop name, recipe replay
#      (bit-identical shards), every source kind (single file, sharded, .bin, LoRA, Hub ids from a cache), --kernel-check (numba kernels in use, cache outside the bundle), eval and
#      compare of the demo's models on its suites, bad inputs (exit 2, one `error:` line, no traceback, nothing written),
#   3. runs the window frozen: `ram-desktop --self-test` (it forces the offscreen platform itself) and
#      `ram-desktop --demo --screenshot` (offscreen; SCREENSHOT_OUT=FILE keeps a copy of the PNG).
# Exit 0 when everything passed; otherwise the first failing check is printed with its output.
set -euo pipefail

cd "$(dirname "$0")/.."
T0=$(date +%s)
say() { printf '[bundle-test %4ss] %s\n' "$(( $(date +%s) - T0 ))" "$*" >&2; }

if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
    PACKAGES=${PACKAGES:-0} packaging/build.sh
fi
BUNDLE=$PWD/dist/ram-desktop
[[ -x "$BUNDLE/ram-desktop" && -L "$BUNDLE/ram-merge" ]] || { echo "FAIL: no bundle at $BUNDLE" >&2; exit 1; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/ram-bundle-test.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
EMPTY_PATH=$TMP/empty-path  # PATH holds one empty folder: no python, no shell tools
mkdir -p "$EMPTY_PATH" "$TMP/home"
FAILS=0

# frozen NAME ARGS...: run bundle executable NAME with nothing inherited (but EXTRA_ENV); stdout+stderr to $TMP/out
EXTRA_ENV=()
frozen() {
    local name=$1; shift
    env -i PATH="$EMPTY_PATH" HOME="$TMP/home" LANG=C.UTF-8 ${EXTRA_ENV[@]+"${EXTRA_ENV[@]}"} \
        "$BUNDLE/$name" "$@" >"$TMP/out" 2>&1
}
check() {  # check DESCRIPTION EXPECTED_RC NAME ARGS...; sets CHECK_OK, counts failures, never aborts
    local what=$1 want=$2; shift 2
    local rc=0
    frozen "$@" || rc=$?
    CHECK_OK=0
    if [[ "$rc" != "$want" ]]; then
        echo "FAIL: $what: exit $rc, expected $want" >&2
        sed 's/^/    | /' "$TMP/out" | tail -20 >&2
        FAILS=$((FAILS + 1))
        return 0
    fi
    CHECK_OK=1
    say "ok: $what (exit $rc)"
}
bad_input() {  # bad_input DESCRIPTION ARGS...: exit 2, an `error:` line, no traceback
    local what=$1; shift
    check "$what" 2 ram-merge "$@"
    [[ "$CHECK_OK" == 1 ]] || return 0
    if ! grep -q '^error: ' "$TMP/out" || grep -q 'Traceback' "$TMP/out"; then
        echo "FAIL: $what: expected one 'error:' line and no traceback" >&2
        sed 's/^/    | /' "$TMP/out" >&2
        FAILS=$((FAILS + 1))
    fi
}

# No interpreter reachable, and the bundle does not lean on one.
if env -i PATH="$EMPTY_PATH" /bin/sh -c 'command -v python3 || command -v python' >/dev/null 2>&1; then
    echo "FAIL: a python is on the test PATH" >&2; exit 1
fi

D=$TMP/demo
check "ram-merge --version" 0 ram-merge --version
# Qt offscreen + bundled icons + pyqtgraph's by-name imports + chart PNG export (packaging/entry.py)
check "ram-desktop --bundle-check" 0 ram-desktop --bundle-check
[[ "$CHECK_OK" == 1 ]] && say "    $(tail -1 "$TMP/out")"
check "ram-merge demo" 0 ram-merge demo "$D"
[[ "$CHECK_OK" == 1 ]] || exit 1
AGENTS=()
for dir in "$D"/*/; do
    dir=${dir%/}
    # agents: model folders other than base (the demo also writes suites/)
    [[ "$(basename "$dir")" != base && -f "$dir/config.json" ]] && AGENTS+=("$dir")
done
(( ${#AGENTS[@]} >= 2 )) || { echo "FAIL: demo wrote ${#AGENTS[@]} agents" >&2; exit 1; }
check "ram-merge merge (ram-plus, ${#AGENTS[@]} agents)" 0 ram-merge -q merge "$D/base" "${AGENTS[@]}" --out "$D/merged"
for f in config.json merge-report.json ram-recipe.yaml README.md; do
    [[ -s "$D/merged/$f" ]] || { echo "FAIL: merged output lacks $f" >&2; FAILS=$((FAILS + 1)); }
done
ls "$D/merged"/*.safetensors >/dev/null 2>&1 || { echo "FAIL: merged output has no .safetensors" >&2; FAILS=$((FAILS + 1)); }
grep -q '"ram-probe/1"' "$D/merged/merge-report.json" || { echo "FAIL: merge-report.json lacks ram-probe/1" >&2; FAILS=$((FAILS + 1)); }
check "ram-desktop probe --json (CLI through the app's name)" 0 ram-desktop -q probe "$D/base" "${AGENTS[@]}" --json "$TMP/probe.json"
[[ -s "$TMP/probe.json" ]] || { echo "FAIL: probe --json wrote nothing" >&2; FAILS=$((FAILS + 1)); }
check "ram-merge run recipe (replay)" 0 ram-merge -q run "$D/merged/ram-recipe.yaml" --out "$D/replayed"
for shard in "$D/merged"/*.safetensors; do
    cmp -s "$shard" "$D/replayed/$(basename "$shard")" \
        || { echo "FAIL: replayed $(basename "$shard") differs from the first merge" >&2; FAILS=$((FAILS + 1)); }
done
check "ram-merge merge --method ram --out-dtype float32" 0 ram-merge -q merge "$D/base" "${AGENTS[@]}" --method ram --out-dtype float32 --out "$D/ram"

# Every source kind, frozen: a single .safetensors file, a sharded folder (written by the bundle itself),
# a PyTorch .bin and a LoRA adapter (written by the test venv's Python: the bundle only reads them), and
# Hub ids served offline from a huggingface_hub cache laid out here (refs/main -> snapshots/<sha>/).
check "merge with single-file agents" 0 ram-merge -q merge "$D/base" "${AGENTS[0]}/model.safetensors" \
    "${AGENTS[1]}/model.safetensors" --out "$TMP/kinds-single"
check "merge writing a sharded output" 0 ram-merge -q merge "$D/base" "${AGENTS[@]}" --shard-size 100KB \
    --out "$TMP/sharded"
[[ -f "$TMP/sharded/model.safetensors.index.json" ]] \
    || { echo "FAIL: --shard-size 100KB wrote no index" >&2; FAILS=$((FAILS + 1)); }
check "probe with a sharded agent" 0 ram-merge -q probe "$D/base" "$TMP/sharded" "${AGENTS[1]}"
HOST_PY=${HOST_PY:-.venv/bin/python}
if [[ -x "$HOST_PY" ]]; then
    "$HOST_PY" - "$D/base" "${AGENTS[0]}" "$TMP/bin-agent" "$TMP/lora-agent" <<'PY'
import json, shutil, sys
from pathlib import Path
import torch
from safetensors.torch import load_file, save_file
base, agent, bin_dir, lora_dir = map(Path, sys.argv[1:])
shutil.copytree(agent, bin_dir, ignore=shutil.ignore_patterns("*.safetensors"))
torch.save(load_file(agent / "model.safetensors"), bin_dir / "pytorch_model.bin")
lora_dir.mkdir()
g = torch.Generator().manual_seed(0)
factors = {}
for name, w in load_file(base / "model.safetensors").items():
    if name.endswith("q_proj.weight"):
        module = "base_model.model." + name[: -len(".weight")]
        factors[module + ".lora_A.weight"] = torch.randn(4, w.shape[1], generator=g) * 0.05
        factors[module + ".lora_B.weight"] = torch.randn(w.shape[0], 4, generator=g) * 0.05
save_file(factors, str(lora_dir / "adapter_model.safetensors"))
(lora_dir / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8,
    "target_modules": ["q_proj"], "base_model_name_or_path": str(base)}))
PY
    check "merge with a .bin agent" 0 ram-merge -q merge "$D/base" "$TMP/bin-agent" "${AGENTS[1]}" --out "$TMP/kinds-bin"
    check "merge with a LoRA adapter agent" 0 ram-merge -q merge "$D/base" "$TMP/lora-agent" "${AGENTS[1]}" \
        --out "$TMP/kinds-lora"
else
    say "skip: .bin and LoRA agents (no host Python at $HOST_PY to write them)"
fi
HUB=$TMP/hub
HUB_IDS=()
for dir in "$D/base" "${AGENTS[@]}"; do
    name=$(basename "$dir"); sha=$(printf '%040d' "${#HUB_IDS[@]}")
    mkdir -p "$HUB/models--acme--$name/snapshots/$sha" "$HUB/models--acme--$name/refs"
    cp "$dir"/* "$HUB/models--acme--$name/snapshots/$sha/"
    printf '%s' "$sha" > "$HUB/models--acme--$name/refs/main"
    HUB_IDS+=("acme/$name")
done
EXTRA_ENV=(HF_HUB_OFFLINE=1 HF_HUB_CACHE="$HUB")
check "probe on Hub ids from the cache (offline)" 0 ram-merge -q probe "${HUB_IDS[@]}"
check "merge of Hub ids from the cache (offline)" 0 ram-merge -q merge "${HUB_IDS[@]}" --out "$TMP/kinds-hub"
for shard in "$D/merged"/*.safetensors; do
    cmp -s "$shard" "$TMP/kinds-hub/$(basename "$shard")" \
        || { echo "FAIL: the merge of Hub ids differs from the merge of the same folders" >&2; FAILS=$((FAILS + 1)); }
done
EXTRA_ENV=()

# The fused numba kernels, frozen (numba + llvmlite bundled, kernel_code.py shipped as source): the
# merges above ran through them; --kernel-check compares a kernel with torch and checks numba cached
# its code in the user cache folder (NUMBA_CACHE_DIR set by entry.py), never inside the bundle.
check "ram-merge --kernel-check (numba kernels, not the torch fallback)" 0 ram-merge --kernel-check
[[ "$CHECK_OK" == 1 ]] && say "    $(tail -1 "$TMP/out")"
[[ -f "$BUNDLE/_internal/ram_desktop/core/engine/kernel_code.py" ]] \
    || { echo "FAIL: the bundle lacks ram_desktop/core/engine/kernel_code.py as source" >&2; FAILS=$((FAILS + 1)); }
if find "$BUNDLE" -name '*.nbi' | grep -q .; then
    echo "FAIL: numba wrote its cache inside the bundle (read-only when installed)" >&2; FAILS=$((FAILS + 1))
fi

# `ram-merge eval` and `compare`, frozen (transformers, tokenizers, the suites' python reward files):
# the demo's real base and RL-trained agents on their own suites (first examples only, for time).
check "ram-merge eval (demo base + coder on the code suite)" 0 ram-merge -q eval "$D/base" "$D/coder" \
    --suite "$D/suites/code" --limit 4 --json "$TMP/eval.json"
if [[ "$CHECK_OK" == 1 ]]; then
    # a score row: the score and its 95 % interval (then "≈" when no better than the suite's floor)
    if grep -q '^model ' "$TMP/out" && grep -q '^coder  *[0-9.]* \[[0-9.]*, [0-9.]*\]' "$TMP/out" \
        && grep -q '"ram-eval/2"' "$TMP/eval.json"; then
        say "    $(tr '\n' ' ' < "$TMP/out")"
    else
        echo "FAIL: frozen eval printed no score table or wrote no ram-eval/2 JSON" >&2
        sed 's/^/    | /' "$TMP/out" >&2; FAILS=$((FAILS + 1))
    fi
fi
check "ram-merge compare (demo, RAM+ variant, evaluated)" 0 ram-merge -q compare "$D/base" "${AGENTS[@]}" \
    --variant ram-plus --suite "$D/suites/code" --limit 2 --out "$TMP/cmp"
if [[ "$CHECK_OK" == 1 ]] && { ! grep -q '^ram-plus  *[0-9.]* \[' "$TMP/out" || [[ ! -s "$TMP/cmp/compare.json" ]]; }; then
    echo "FAIL: frozen compare printed no ram-plus score or wrote no compare.json" >&2
    sed 's/^/    | /' "$TMP/out" >&2; FAILS=$((FAILS + 1))
fi
bad_input "eval: missing suite" eval "$D/base" --suite "$D/no-such-suite"

# Bad input: exit 2, one `error:` line, nothing written.
bad_input "missing base path" merge "$D/no-such-model" "${AGENTS[@]}" --out "$D/bad1"
printf 'not a safetensors file at all' > "$TMP/corrupt.safetensors"
bad_input "corrupt safetensors agent" merge "$D/base" "$TMP/corrupt.safetensors" --out "$D/bad2"
bad_input "existing output without --overwrite" merge "$D/base" "${AGENTS[@]}" --out "$D/merged"
bad_input "usage error (no arguments)" merge
bad_input "unknown method" merge "$D/base" "${AGENTS[@]}" --method nope --out "$D/bad3"
for out in bad1 bad2 bad3; do
    [[ ! -e "$D/$out" ]] || { echo "FAIL: a failed merge left $D/$out behind" >&2; FAILS=$((FAILS + 1)); }
done
if ls -d "$D"/*.partial-* >/dev/null 2>&1; then
    echo "FAIL: a failed merge left a .partial folder" >&2; FAILS=$((FAILS + 1))
fi

# The compute set-up, frozen (docs/compute.md): the bundled uv and lock files, a dry run, then an offline
# install of a CPU torch from a local folder of wheels into a runtime folder of a separate HOME, and proof
# that the frozen app then imports torch from that folder (and merges with it, bit-identical to the bundled
# torch's merge on the torch path), and that RAM_DESKTOP_RUNTIME=off or a damaged folder brings back the
# bundled torch with one line saying why.
[[ -x "$BUNDLE/_internal/uv/uv" ]] || { echo "FAIL: the bundle lacks _internal/uv/uv" >&2; FAILS=$((FAILS + 1)); }
ls "$BUNDLE/_internal/locks/"*.txt >/dev/null 2>&1 || { echo "FAIL: the bundle lacks _internal/locks/" >&2; FAILS=$((FAILS + 1)); }
check "ram-desktop --setup-compute --dry-run" 0 ram-desktop --setup-compute --dry-run
if [[ "$CHECK_OK" == 1 ]] && ! grep -q '^plan: ' "$TMP/out"; then
    echo "FAIL: the dry run printed no plan" >&2; sed 's/^/    | /' "$TMP/out" >&2; FAILS=$((FAILS + 1))
fi
check "ram-desktop --setup-compute cuda --dry-run (the PyPI CUDA 13 lock is bundled)" 0 ram-desktop --setup-compute cuda --dry-run
grep -q 'plan: install — torch 2.13.0, CUDA 13.0 build from PyPI' "$TMP/out" \
    || { echo "FAIL: no CUDA 13 plan from the bundled lock" >&2; sed 's/^/    | /' "$TMP/out" >&2; FAILS=$((FAILS + 1)); }
WHEELS=${WHEELHOUSE:-$TMP/wheels}
REAL_TORCH=1
if [[ -z "${WHEELHOUSE:-}" ]]; then
    mkdir -p "$WHEELS"
    # a CPU build of torch where this machine's pip finds one (its configured wheels), else the stand-in
    # torch the tests build (then the frozen merge with it is skipped)
    if ! "$HOST_PY" -m pip download --quiet --no-deps --only-binary=:all: -d "$WHEELS" 'torch==2.13.0+cpu' >/dev/null 2>&1; then
        REAL_TORCH=0
        "$HOST_PY" -c "import sys; sys.path.insert(0, '.'); from pathlib import Path; from tests.fake_torch import build_wheel; import shutil; h = build_wheel(Path(sys.argv[1])); [shutil.copy(w, sys.argv[2]) for w in h.glob('*.whl')]" "$TMP/fake-build" "$WHEELS"
    fi
fi
RT_HOME=$TMP/home-runtime
mkdir -p "$RT_HOME"
EXTRA_ENV=(HOME="$RT_HOME")
check "ram-desktop --setup-compute cpu --offline --find-links (frozen uv, frozen check)" 0 \
    ram-desktop --setup-compute cpu --offline --find-links "$WHEELS"
[[ "$CHECK_OK" == 1 ]] && say "    $(grep '^installed ' "$TMP/out")"
RT=$RT_HOME/.local/share/ram-desktop/runtimes/cpu-torch2.13.0
check "ram-desktop --compute-info after the install" 0 ram-desktop --compute-info
if [[ "$CHECK_OK" == 1 ]] && ! grep -qx "torch file: $RT/site/torch" "$TMP/out"; then
    echo "FAIL: the frozen app did not import torch from the runtime folder" >&2; sed 's/^/    | /' "$TMP/out" >&2
    FAILS=$((FAILS + 1))
else
    say "    $(grep '^torch' "$TMP/out" | tr '\n' ' ')"
fi
if [[ "$REAL_TORCH" == 1 ]]; then
    EXTRA_ENV=(HOME="$RT_HOME" RAM_DESKTOP_KERNELS=0)
    check "merge on the runtime's torch (torch path)" 0 ram-merge -q merge "$D/base" "${AGENTS[@]}" --out "$TMP/rt-merge"
    EXTRA_ENV=(HOME="$RT_HOME" RAM_DESKTOP_KERNELS=0 RAM_DESKTOP_RUNTIME=off)
    check "merge on the bundled torch (torch path)" 0 ram-merge -q merge "$D/base" "${AGENTS[@]}" --out "$TMP/bundled-merge"
    cmp -s "$TMP/rt-merge/model.safetensors" "$TMP/bundled-merge/model.safetensors" \
        || { echo "FAIL: the runtime torch's merge differs from the bundled torch's" >&2; FAILS=$((FAILS + 1)); }
fi
EXTRA_ENV=(HOME="$RT_HOME" RAM_DESKTOP_RUNTIME=off)
check "--compute-info with RAM_DESKTOP_RUNTIME=off" 0 ram-desktop --compute-info
grep -q "^torch file: $BUNDLE/_internal/torch" "$TMP/out" \
    || { echo "FAIL: RAM_DESKTOP_RUNTIME=off did not give the bundled torch" >&2; sed 's/^/    | /' "$TMP/out" >&2; FAILS=$((FAILS + 1)); }
rm -f "$RT/runtime.json"  # a half-written folder: never used, one line says why
EXTRA_ENV=(HOME="$RT_HOME")
check "--compute-info with a half-written runtime folder" 0 ram-desktop --compute-info
if ! grep -q "^torch file: $BUNDLE/_internal/torch" "$TMP/out" || ! grep -q '^note: compute runtime not used (' "$TMP/out"; then
    echo "FAIL: a half-written runtime folder was used or not reported" >&2; sed 's/^/    | /' "$TMP/out" >&2; FAILS=$((FAILS + 1))
fi
EXTRA_ENV=()

# The window, frozen: --self-test (offscreen: demo agents -> analysis -> RAM+ float32 merge -> chart
# export -> output checks; one line) and a --demo screenshot.
if grep -rqs -- '--self-test' ram_desktop/gui ram_desktop/__main__.py; then
    rc=0
    env -i PATH="$EMPTY_PATH" HOME="$TMP/home" LANG=C.UTF-8 \
        "$BUNDLE/ram-desktop" --self-test >"$TMP/out" 2>&1 || rc=$?
    if [[ "$rc" == 0 ]] && grep -q '^self-test ok: ' "$TMP/out"; then
        say "ok: ram-desktop --self-test: $(grep '^self-test ok: ' "$TMP/out")"
    else
        echo "FAIL: ram-desktop --self-test exited $rc" >&2; sed 's/^/    | /' "$TMP/out" | tail -30 >&2
        FAILS=$((FAILS + 1))
    fi
else
    say "skip: ram-desktop --self-test (not in this source yet)"
fi
rc=0
env -i PATH="$EMPTY_PATH" HOME="$TMP/home" LANG=C.UTF-8 QT_QPA_PLATFORM=offscreen \
    "$BUNDLE/ram-desktop" --demo --screenshot "$TMP/window.png" >"$TMP/out" 2>&1 || rc=$?
if [[ "$rc" != 0 ]]; then
    echo "FAIL: ram-desktop --demo --screenshot exited $rc" >&2; sed 's/^/    | /' "$TMP/out" | tail -30 >&2
    FAILS=$((FAILS + 1))
else
    shot_bytes=$(stat -c %s "$TMP/window.png" 2>/dev/null || echo 0)
    if [[ "$(head -c 8 "$TMP/window.png" 2>/dev/null | od -An -tx1 | tr -d ' \n')" != 89504e470d0a1a0a ]] \
        || (( shot_bytes < 20000 )); then
        echo "FAIL: the frozen screenshot is not a PNG of a drawn window ($shot_bytes bytes)" >&2; FAILS=$((FAILS + 1))
    else
        say "ok: ram-desktop --demo --screenshot: window PNG $(( shot_bytes / 1000 )) KB"
        if [[ -n "${SCREENSHOT_OUT:-}" ]]; then cp "$TMP/window.png" "$SCREENSHOT_OUT"; fi
    fi
fi

SIZE_MB=$(( $(du -sb "$BUNDLE" | cut -f1) / 1000000 ))
if (( FAILS )); then
    say "FAILED: $FAILS check(s); bundle $SIZE_MB MB"
    exit 1
fi
say "all bundle checks passed; bundle $SIZE_MB MB unpacked"
