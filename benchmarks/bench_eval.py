"""Evaluation throughput: examples/s and generated tokens/s of ``ram_desktop.evaluate`` on this machine.

Two workloads, each at several batch sizes:

- ``demo``: the built-in demo base + three agents (``ram-merge demo``: a 4-layer, hidden-128 Qwen2
  with a word-level tokenizer), evaluated as four models one after another;
- ``qwen2-0.5b``: a Qwen2-shaped model with Qwen2.5-0.5B's dimensions (hidden 896, 24 layers,
  intermediate 4864, 14 heads / 2 KV heads, vocabulary 151 936, tied embeddings: 494 M parameters)
  with random bf16 weights, generated here once (``--work``, about 1 GB) with the small byte-level
  tokenizer of ``tests/tinylm.py``.

Generation is timed from the runner's own progress events: from "generating with MODEL" (model
loaded) to the model's last batch, so loading is reported apart. Random weights rarely emit the
end-of-sequence token, so most completions run to ``--max-new-tokens``. CPU used by other
processes during each run is measured from ``/proc/stat`` (``other_cores``): numbers taken while
other work runs are slower than on a quiet machine.

    .venv/bin/python benchmarks/bench_eval.py                        # both workloads, batch 1 and 8, 1 and all threads
    .venv/bin/python benchmarks/bench_eval.py --workloads demo --examples 64 --batch-sizes 1,4,16
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ram_desktop.core.events import ProgressEvent, Reporter
from ram_desktop.evaluate import evaluate, load_suite, model_refs

QWEN2_05B = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
}
WORDS = [
    "the",
    "agent",
    "calls",
    "a",
    "tool",
    "to",
    "search",
    "the",
    "code",
    "memory",
    "and",
    "answers",
    "the",
    "question",
    "with",
    "a",
    "plan",
    "then",
    "runs",
    "the",
    "test",
    "and",
    "reports",
    "the",
    "result",
    "of",
    "each",
    "step",
]


def cpu_seconds() -> tuple[float, float]:
    """(busy CPU seconds of the whole machine since boot, this process's CPU seconds)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    busy = (sum(v[:8]) - v[3] - v[4]) / hz
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return busy, ru.ru_utime + ru.ru_stime


def write_suite(folder: Path, examples: int, max_new_tokens: int) -> Path:
    """Prompts of 6 to 20 demo words (deterministic), scored by exact match (the score is irrelevant here)."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(examples):
        n = 6 + (i * 7) % 15
        rows.append({"prompt": " ".join(WORDS[(i + k * 3) % len(WORDS)] for k in range(n)), "answer": "x"})
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "suite.yaml").write_text(f"name: bench\nmax_new_tokens: {max_new_tokens}\nchat_template: false\n")
    return folder


def write_large(folder: Path) -> Path:
    """A Qwen2.5-0.5B-shaped model with random bf16 weights and the tests' small tokenizer (once)."""
    if (folder / "config.json").is_file():
        return folder
    from transformers import Qwen2Config, Qwen2ForCausalLM

    model = write_random_model(folder, Qwen2Config, Qwen2ForCausalLM, QWEN2_05B)
    print(f"wrote {folder}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters", flush=True)
    return folder


def write_random_model(folder: Path, config_class: Any, model_class: Any, shape: dict) -> Any:
    """A model of ``shape`` (a transformers config's sizes) with seeded random bf16 weights and the tests' small
    tokenizer, saved by transformers into ``folder``; returns the model."""
    from transformers import PreTrainedTokenizerFast

    from tests.tinylm import build_tokenizer

    tok = build_tokenizer()
    eos = tok.token_to_id("<|im_end|>")
    config = config_class(**shape, eos_token_id=eos, pad_token_id=tok.token_to_id("<|endoftext|>"), bos_token_id=None)
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = model_class(config)
    finally:
        torch.set_default_dtype(previous)
    model.generation_config.eos_token_id = eos
    model.save_pretrained(folder)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>").save_pretrained(
        folder
    )
    return model


def measure(models: list[Path], suite_dir: Path, batch_size: int, device: str, threads: int | None) -> dict:
    events: list[tuple[float, ProgressEvent]] = []
    reporter = Reporter(lambda e: events.append((time.perf_counter(), e)))
    busy0, own0 = cpu_seconds()
    t0 = time.perf_counter()
    result = evaluate(
        model_refs(models),
        [load_suite(suite_dir)],
        device=device,
        batch_size=batch_size,
        reporter=reporter,
        threads=threads,
    )
    wall = time.perf_counter() - t0
    busy1, own1 = cpu_seconds()
    generating, loading = 0.0, 0.0
    load_start = gen_start = None
    last = t0
    for t, e in events:
        if e.detail.startswith("loading "):
            if gen_start is not None:
                generating += last - gen_start
            load_start, gen_start = t, None
        elif e.detail.startswith("generating with "):
            loading += t - (load_start or t)
            gen_start = t
        last = t
    if gen_start is not None:
        generating += last - gen_start
    examples = len(models) * result.suites[0].examples
    return {
        "batch_size": batch_size,
        "threads": threads or "default",
        "models": len(models),
        "examples": examples,
        "generated_tokens": result.generated_tokens,
        "wall_s": round(wall, 3),
        "load_s": round(loading, 3),
        "generate_s": round(generating, 3),
        "examples_per_s": round(examples / generating, 3),
        "tokens_per_s": round(result.generated_tokens / generating, 2),
        "tokens_per_example": round(result.generated_tokens / examples, 2),
        "own_cpu_s": round(own1 - own0, 2),
        "other_cores": round(max(0.0, (busy1 - busy0) - (own1 - own0)) / wall, 2),
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/work/bench-eval"), help="models and suites go here")
    parser.add_argument("--examples", type=int, default=32, help="examples per suite (default 32)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument(
        "--threads",
        default="1,0",
        help="CPU threads to try; 0 = evaluate's default (one for a "
        "model under 50 M parameters on the CPU, else torch's: all cores)",
    )
    parser.add_argument("--large-examples", type=int, default=16, help="examples for the 0.5B model (default 16)")
    parser.add_argument("--workloads", default="demo,qwen2-0.5b", help="demo, qwen2-0.5b or both (default)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", type=Path, help="write the measurements here")
    args = parser.parse_args()
    logging.getLogger("ram_desktop").setLevel(logging.ERROR)  # the demo's tokenizer warning, once per model
    from ram_desktop.core.demo import write_demo

    args.work.mkdir(parents=True, exist_ok=True)
    if not (args.work / "demo" / "base").is_dir():
        write_demo(args.work / "demo")
    demo = [args.work / "demo" / n for n in ("base", "coder", "tool", "memory")]
    runs = []
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    thread_counts = [int(t) for t in args.threads.split(",")]
    chosen = args.workloads.split(",")
    workloads = []
    if "demo" in chosen:
        workloads.append(("demo", demo, write_suite(args.work / "suite-demo", args.examples, args.max_new_tokens)))
    if "qwen2-0.5b" in chosen:
        workloads.append(
            (
                "qwen2-0.5b",
                [write_large(args.work / "qwen2-0.5b")],
                write_suite(args.work / "suite-large", args.large_examples, args.max_new_tokens),
            )
        )
    print(
        f"{'workload':12s} {'threads':>7s} {'batch':>5s} {'examples':>8s} {'tokens':>7s} {'load s':>7s} {'gen s':>7s} "
        f"{'ex/s':>7s} {'tok/s':>8s} {'other cores':>11s}",
        flush=True,
    )
    for name, models, suite_dir in workloads:
        for threads, batch in [(t, b) for t in thread_counts for b in sizes]:
            row = {"workload": name, **measure(models, suite_dir, batch, args.device, threads or None)}
            runs.append(row)
            print(
                f"{name:12s} {row['threads']!s:>7s} {batch:5d} {row['examples']:8d} {row['generated_tokens']:7d} {row['load_s']:7.2f} "
                f"{row['generate_s']:7.2f} {row['examples_per_s']:7.2f} {row['tokens_per_s']:8.1f} "
                f"{row['other_cores']:11.2f}",
                flush=True,
            )
    info = {
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "max_new_tokens": args.max_new_tokens,
        "runs": runs,
    }
    if args.json:
        args.json.write_text(json.dumps(info, indent=1) + "\n")


if __name__ == "__main__":
    main()
