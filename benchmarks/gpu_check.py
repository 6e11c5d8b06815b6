#!/usr/bin/env python3
"""The GPU check for a lease: one command, one JSON and one log (``benchmarks/gpu_check.sh`` runs it).

Stages, each skipped (and said so in the JSON) when the deadline would be passed:

1. ``env``: torch, the device, the host→device copy bandwidth (pageable and pinned) against the bus's.
2. ``methods``: every method of ``METHODS`` on a small Qwen2 layout, on ``--device`` and on the CPU (kernels on,
   as a user runs it): the share of elements whose bytes differ, the largest difference in units in the last
   place, and whether that is within the method's ``gpu_tolerance`` (docs/methods.md, "On a GPU"). With
   ``--device cpu`` (the dry run) the "device" side is the CPU's torch path, the formulation a GPU runs.
3. ``large``: the issue-45 table on a generated layout (qwen2-1.5b on a GPU, generated on the device; a tiny one
   for the dry run): ``ram``, ``ties`` (per-model weight and density) and ``della`` as mergekit YAML through
   ``ram-merge run`` (device ``auto``: what it picks and why) and mergekit 0.1.5 ``--cuda`` (``RAM_MERGEKIT``;
   skipped when unset, ``none`` or absent), each whole process against whole process; and RAM+ (probe and
   merge) on the device, on the CPU and on ``auto``. Outputs compared byte for byte where they should agree.
4. ``eval``: generation throughput of a random-weight model of SmolLM2-135M's shape (a tiny one in the dry
   run) on the device, batch 1 and 16.

    OUT=/tmp/check DEV=cuda bash benchmarks/gpu_check.sh      # on a GPU lease
    OUT=/tmp/check DEV=cpu bash benchmarks/gpu_check.sh       # the dry run CI runs (tests/test_gpu_check.py)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

import torch
from bench_merge import compare_outputs, drop_dir, input_files, read_all, run_measured
from bench_merge_large import config_text
from safetensors.torch import save_file

from tests.synthetic import demo_shapes

SMALL = {  # every method's check: a few chunks per MLP tensor, sharded agents
    "hidden_size": 512,
    "intermediate_size": 1408,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 4096,
}
TINY = {
    **SMALL,
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_attention_heads": 4,
    "head_dim": 16,
    "vocab_size": 256,
}
QWEN2_15B = {
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "vocab_size": 151936,
}
SMOLLM2_135M = {  # HuggingFaceTB/SmolLM2-135M-Instruct's shape
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
}
TINY_LM = {
    **SMOLLM2_135M,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
}
# mergekit's spelling of each large merge: models used, per-model parameters, shared parameters
LARGE_CONFIGS: dict[str, tuple[int, dict, dict]] = {
    "ram": (3, {}, {}),
    "ties": (3, {"weight": [0.5, 1.0, 0.8], "density": [0.3, 0.5, 0.7]}, {"normalize": "true"}),
    "della": (3, {"weight": 1.0, "density": 0.5, "epsilon": 0.1}, {}),
}
AGENTS = ("coder", "tool", "memory")
# a layer map for a method that stacks layers (passthrough): agent 1's first layer on agent 2's two
STACKED = [{"sources": [{"model": 1, "layer_range": [0, 1]}]}, {"sources": [{"model": 2, "layer_range": [0, 2]}]}]
DENSITY = (0.12, 0.10, 0.03)  # RL-like sparse updates


class Check:
    """The run's clock, JSON and log."""

    def __init__(self, out: Path, budget_s: float) -> None:
        self.out = out
        self.start = time.monotonic()
        self.budget_s = budget_s
        self.data: dict[str, Any] = {"format": "ram-desktop/gpu-check/1", "stages": {}}
        self.log_file = open(out / "gpu-check.log", "a", buffering=1)  # noqa: SIM115 — open for the whole run

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.start)

    def say(self, text: str) -> None:
        line = f"[{time.monotonic() - self.start:6.1f}s] {text}"
        print(line, flush=True)
        self.log_file.write(line + "\n")

    def save(self) -> None:
        self.data["seconds"] = round(time.monotonic() - self.start, 1)
        (self.out / "gpu-check.json").write_text(json.dumps(self.data, indent=1) + "\n")


# ---- inputs ------------------------------------------------------------------------------------------


def write_layout(folder: Path, config: dict, device: str, seed: int = 45) -> tuple[Path, list[Path]]:
    """A bf16 Qwen2 base and three RL-like agents (sparse updates of a few ulps), drawn on ``device`` (fast on a
    GPU: the 1.5B set in seconds, where a CPU generator took minutes) and written in shards of ≤ 2 GB."""
    gen = torch.Generator(device=device).manual_seed(seed)
    full = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        **config,
    }
    names = ["base", *AGENTS]
    shards: dict[str, list[dict[str, torch.Tensor]]] = {n: [{}] for n in names}
    sizes = dict.fromkeys(names, 0)
    limit = 2 << 30
    for name, shape in demo_shapes(config).items():
        scale = 1.0 if name.endswith("norm.weight") else 0.02
        base = (scale * torch.randn(shape, generator=gen, device=device)).to(torch.bfloat16)
        tensors = {"base": base}
        for agent, density in zip(AGENTS, DENSITY):
            moved = torch.rand(shape, generator=gen, device=device) < density
            step = torch.randint(-3, 4, shape, generator=gen, device=device).to(torch.float32)
            ulp = base.float().abs().clamp_min(1e-6) * 2.0**-7
            tensors[agent] = torch.where(moved, base.float() + step * ulp, base.float()).to(torch.bfloat16)
        for n, t in tensors.items():
            size = t.numel() * 2
            if sizes[n] + size > limit and shards[n][-1]:
                shards[n].append({})
                sizes[n] = 0
            shards[n][-1][name] = t.cpu()
            sizes[n] += size
    dirs = []
    for n in names:
        d = folder / n
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps(full, indent=1))
        parts = shards[n]
        if len(parts) == 1:
            save_file(parts[0], str(d / "model.safetensors"), metadata={"format": "pt"})
        else:
            weight_map = {}
            for k, part in enumerate(parts):
                file = f"model-{k + 1:05d}-of-{len(parts):05d}.safetensors"
                save_file(part, str(d / file), metadata={"format": "pt"})
                weight_map.update(dict.fromkeys(part, file))
            (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
        dirs.append(d)
    return dirs[0], dirs[1:]


def random_fishers(folder: Path, agents: list[Path]) -> list[Path]:
    from safetensors import safe_open

    found = []
    for k, agent in enumerate(agents):
        tensors = {}
        for file in sorted(agent.glob("*.safetensors")):
            with safe_open(str(file), "pt") as f:
                for key in f.keys():  # noqa: SIM118 — safe_open is not iterable
                    shape = f.get_slice(key).get_shape()
                    tensors[key] = torch.rand(shape, generator=torch.Generator().manual_seed(k)) + 0.01
        out = folder / f"fisher-{k}"
        out.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(out / "fisher.safetensors"))
        found.append(out)
    return found


# ---- stages ------------------------------------------------------------------------------------------


def stage_env(check: Check, device: str) -> dict:
    info: dict[str, Any] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu_cores": os.cpu_count(),
        "device": device,
    }
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = props.name
        info["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        size = 1 << 28  # 256 MiB
        pageable = torch.empty(size, dtype=torch.uint8)
        pinned = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        target = torch.empty(size, dtype=torch.uint8, device=device)
        for label, host in (("pageable", pageable), ("pinned", pinned)):
            target.copy_(host, non_blocking=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(8):
                target.copy_(host, non_blocking=True)
            torch.cuda.synchronize()
            info[f"h2d_{label}_gb_s"] = round(8 * size / (time.perf_counter() - t0) / 1e9, 1)
        info["bus_note"] = "PCIe 5.0 x16: 64 GB/s per direction in theory, ~55 GB/s in practice"
    check.say(f"env: {info}")
    return info


def stage_methods(check: Check, device: str, work: Path) -> dict:
    from ram_desktop.core import pipeline
    from ram_desktop.core.engine import kernels
    from ram_desktop.core.methods import METHODS
    from ram_desktop.core.spec import MergeSpec

    config = TINY if device == "cpu" else SMALL
    base, agents = write_layout(work / "small", config, device if device != "cpu" else "cpu")
    fishers = random_fishers(work / "small-fisher", agents)
    rows: dict[str, dict] = {}
    for name, method in METHODS.items():
        if check.left() < 60:
            rows[name] = {"status": "skipped: the deadline"}
            continue
        count = min(method.agents[1] or 3, 3)
        params: dict[str, Any] = {"fisher": [str(f) for f in fishers[:count]]} if name == "fisher" else {}
        if name == "wudi":
            params = {"steps": 40}
        row: dict[str, Any] = {"tolerance": method.gpu_tolerance}
        outs = {}
        for side in ("cpu", "device"):
            out = work / "merged" / f"{name}-{side}"
            drop_dir(out)
            spec = MergeSpec.build(
                base,
                agents[:count],
                output=out,
                method=name,
                params=params,
                device="cpu" if side == "cpu" else device,
                slices=STACKED if method.streaming.stacks else None,
            )
            t0 = time.perf_counter()
            try:
                if side == "device" and device == "cpu":
                    with kernels.disabled():
                        pipeline.merge(spec)
                else:
                    pipeline.merge(spec)
            except Exception as e:  # noqa: BLE001 — a crash is this stage's finding, not its end
                row[f"{side}_error"] = f"{type(e).__name__}: {e}"[:300]
            row[f"{side}_s"] = round(time.perf_counter() - t0, 2)
            outs[side] = out
        if "cpu_error" in row or "device_error" in row:
            row["status"] = "crash"
        else:
            diff = compare_outputs(outs["cpu"], outs["device"])
            row.update({k: diff[k] for k in ("elements", "differing", "max_abs_diff") if k in diff})
            share = diff.get("differing", 0) / max(diff.get("elements", 1), 1)
            row["differing_share"] = round(share, 6)
            if name == "wudi":  # BLAS's order: agreement to float32 rounding (docs/methods.md, WUDI)
                row["status"] = "same bytes" if not diff.get("differing") else "float32 rounding"
            elif "error" in diff:
                row["status"] = f"differs: {diff['error']}"
            elif not diff["differing"]:
                row["status"] = "same bytes"
            else:
                row["status"] = "within tolerance" if share <= method.gpu_tolerance else "over tolerance"
        for out in outs.values():
            drop_dir(out)
        rows[name] = row
        check.say(f"methods: {name:26s} {row['status']}")
    return rows


def _report_device(out: Path) -> dict:
    try:
        report = json.loads((out / "merge-report.json").read_text())
    except (OSError, ValueError):
        return {}
    return {"ran_on": report.get("device"), "why": report.get("device_reason")}


def stage_large(check: Check, device: str, work: Path, mergekit: str | None) -> dict:
    config = TINY if device == "cpu" else QWEN2_15B
    t0 = time.perf_counter()
    base, agents = write_layout(work / "large", config, device)
    generate_s = round(time.perf_counter() - t0, 1)
    inputs = input_files([base, *agents])
    floor_s, floor_bytes = read_all(inputs)
    check.say(
        f"large: {floor_bytes / 1e9:.2f} GB written in {generate_s} s, read from the page cache in {floor_s:.2f} s"
    )
    ours = [sys.executable, "-m", "ram_desktop"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    runs: list[dict] = []
    scratch = work / "large-runs"
    scratch.mkdir(exist_ok=True)

    def run(label: str, cmd: list[str], out: Path, keep: bool = False) -> dict:
        if check.left() < 45:
            row = {"run": label, "status": "skipped: the deadline"}
        else:
            drop_dir(out)
            read_all(inputs)  # both sides start from the page cache
            measured = run_measured(cmd, scratch / f"{label}.log", 0.05, max(30.0, check.left() - 30), env)
            row = {
                "run": label,
                **{
                    k: measured.get(k)
                    for k in ("ok", "wall_s", "cpu_user_s", "cpu_sys_s", "peak_anon_mb", "error", "log_tail")
                },
            }
            row.update(_report_device(out))
        runs.append(row)
        check.say(f"large: {label:28s} {row.get('wall_s')} s {row.get('ran_on', '')} {row.get('error') or ''}")
        if not keep:
            drop_dir(out)
        return row

    for method in LARGE_CONFIGS:
        cfg = scratch / f"{method}.yaml"
        cfg.write_text(config_text(method, base, agents, "float32", LARGE_CONFIGS))
        mine = scratch / f"{method}-ours"
        run(f"{method} ours (auto)", [*ours, "run", str(cfg), "--out", str(mine)], mine, keep=True)
        if mergekit:
            theirs = scratch / f"{method}-mergekit"
            row = run(
                f"{method} mergekit --cuda",
                [mergekit, str(cfg), str(theirs), "--cuda", "--lazy-unpickle"],
                theirs,
                keep=True,
            )
            if row.get("ok") and mine.is_dir():
                row["bytes_vs_ours"] = compare_outputs(mine, theirs)
            drop_dir(theirs)
        drop_dir(mine)
    sources = [str(base), *map(str, agents)]
    kept = {}
    for dev in [device, "cpu", "auto"] if device != "cpu" else ["cpu", "auto"]:
        out = scratch / f"ram-plus-{dev}"
        run(
            f"ram-plus --device {dev}",
            [*ours, "merge", *sources, "--method", "ram-plus", "--device", dev, "--out", str(out)],
            out,
            keep=True,
        )
        kept[dev] = out
    if device != "cpu" and all(p.is_dir() for p in kept.values()):
        runs.append({"run": f"ram-plus bytes {device} vs cpu", **compare_outputs(kept[device], kept["cpu"])})
    for out in kept.values():
        drop_dir(out)
    shutil.rmtree(work / "large", ignore_errors=True)
    return {
        "layout": "qwen2-1.5b" if device != "cpu" else "tiny",
        "input_bytes": floor_bytes,
        "generate_s": generate_s,
        "page_cache_read_s": round(floor_s, 2),
        "runs": runs,
    }


def stage_eval(check: Check, device: str, work: Path) -> dict:
    from bench_eval import measure, write_random_model, write_suite
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = work / "smollm2-shape"
    write_random_model(folder, LlamaConfig, LlamaForCausalLM, TINY_LM if device == "cpu" else SMOLLM2_135M)
    examples = 4 if device == "cpu" else 64
    suite = write_suite(work / "eval-suite", examples, 32 if device != "cpu" else 8)
    rows = []
    for batch in (1, 16):
        if check.left() < 30:
            rows.append({"batch_size": batch, "status": "skipped: the deadline"})
            continue
        row = measure([folder], suite, batch, device, None)
        rows.append(row)
        check.say(f"eval: batch {batch}: {row['examples_per_s']} examples/s, {row['tokens_per_s']} tokens/s")
    return {"model": "random weights, SmolLM2-135M's shape" if device != "cpu" else "tiny", "runs": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default=os.environ.get("DEV", "cuda"))
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/gpu-check")))
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default: a folder under /tmp)")
    ap.add_argument("--budget", type=float, default=None, help="seconds for the whole check (GPU 520, CPU 300)")
    ap.add_argument("--stages", default="env,methods,large,eval")
    a = ap.parse_args(argv)
    device = a.device
    a.out.mkdir(parents=True, exist_ok=True)
    work = a.work or Path(f"/tmp/gpu-check-work-{os.getpid()}")
    work.mkdir(parents=True, exist_ok=True)
    check = Check(a.out, a.budget or (300.0 if device == "cpu" else 520.0))
    mergekit = os.environ.get("RAM_MERGEKIT")
    if not mergekit or mergekit == "none" or not Path(mergekit).exists():
        mergekit = None
    check.data.update({"device": device, "mergekit": mergekit or "skipped (RAM_MERGEKIT unset, none or absent)"})
    stages = {
        "env": lambda: stage_env(check, device),
        "methods": lambda: stage_methods(check, device, work),
        "large": lambda: stage_large(check, device, work, mergekit),
        "eval": lambda: stage_eval(check, device, work),
    }
    failed = False
    try:
        for name in a.stages.split(","):
            check.say(f"stage {name}")
            try:
                check.data["stages"][name] = stages[name]()
            except Exception as e:  # noqa: BLE001 — one stage's failure is recorded; the others still run
                failed = True
                check.data["stages"][name] = {"error": f"{type(e).__name__}: {e}"[:500]}
                check.say(f"stage {name} failed: {type(e).__name__}: {e}")
            check.save()
    finally:
        shutil.rmtree(work, ignore_errors=True)
        check.save()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
