"""Memory of the Fisher estimate: the peak above the model's weights grows with the largest parameter,
not with the model.

Two random-weight Qwen2 models written with transformers share every dimension (hidden 512, vocabulary
rows 4096, so the largest parameters are the 2.1M-element embedding and output layer) and differ in
depth: 1 layer (~7M parameters) and 12 layers (~39M). Each runs ``estimate_fisher`` on the CPU in a
fresh process (8 calibration prompts, greedy completions of 16 tokens) and reports

- ``grad_peak``: the most gradient bytes alive at once, read inside every post-accumulate-grad hook
  (the hooks free each gradient as soon as it is squared into the accumulator);
- ``rss_above``: peak resident memory (VmHWM, reset once the model is loaded) minus the memory then
  (which holds the weights), minus the float32 host accumulator (model-sized by design: it is F);
- the same two numbers for the textbook loop (``loss.backward()`` then read every ``p.grad``), which
  holds the gradients of the whole model at once.

    python benchmarks/bench_fisher.py [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPTS = [
    "What is 2 + 3?",
    "Say hello to the world",
    "def add(a, b):",
    "Remember the number 42",
    "tool call: search(query='weather')",
    "Question: how many legs does a cat have?",
    "Repeat: 7 7 7",
    "Then stop.",
]
SIZES = {"small": 1, "large": 12}


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0)


def write_model(folder: Path, layers: int) -> int:
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    from tests.tinylm import build_tokenizer

    tok = build_tokenizer()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    config = Qwen2Config(
        vocab_size=4096,
        hidden_size=512,
        intermediate_size=1024,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        eos_token_id=tok.token_to_id("<|im_end|>"),
        bos_token_id=None,
        pad_token_id=tok.token_to_id("<|endoftext|>"),
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def measure(folder: Path, suite: Path, mode: str) -> dict:
    """Runs in a child process: one estimate, memory as described in the module docstring."""
    import torch

    from ram_desktop.evaluate import fisher as fm

    torch.set_num_threads(2)
    live = {"peak": 0}
    params_seen: list = []
    real_square = fm._square_into

    def counting_square(acc):
        inner = real_square(acc)

        def hook(param):
            if not params_seen:
                params_seen.extend(_model_params())
            live["peak"] = max(live["peak"], sum(p.grad.numel() * 4 for p in params_seen if p.grad is not None))
            inner(param)

        return hook

    model_ref: dict = {}
    real_load = fm._load

    def load(*args, **kwargs):
        model, tokenizer = real_load(*args, **kwargs)
        model_ref["model"] = model
        params_seen.clear()
        live["before"] = _status("VmRSS")  # weights loaded; the accumulator and the passes come next
        _reset_peak()
        return model, tokenizer

    def _model_params():
        return list(model_ref["model"].parameters())

    fm._load = load
    if mode == "hooks":
        fm._square_into = counting_square
    else:  # the textbook loop: backward() keeps every gradient, then they are squared and dropped
        real_one = fm._Squares._one_by_one

        def one(self, *args):
            real_one(self, *args)
            model = self.model
            live["peak"] = max(live["peak"], sum(p.grad.numel() * 4 for p in model.parameters() if p.grad is not None))
            for p in model.parameters():
                if p.grad is not None:
                    p.grad = None

        fm._Squares._one_by_one = one
        fm._square_into = lambda acc: lambda param: None  # hooks do nothing: gradients stay in p.grad
    from ram_desktop.evaluate.suites import load_suite

    s = load_suite(suite)
    # one example per pass (batch=1): the hooks' loop, whose memory this measures (batched passes hold
    # batch × the model's gradients by design)
    fm.estimate_fisher(folder, s, examples=1, device="cpu", batch=1)  # warm-up: imports, allocator
    live["peak"] = 0
    estimate = fm.estimate_fisher(folder, s, examples=len(PROMPTS), device="cpu", batch=1)
    peak = _status("VmHWM")
    before = live["before"]
    n_params = sum(t.numel() for t in {id(t): t for t in estimate.tensors.values()}.values())
    largest = max(t.numel() for t in estimate.tensors.values())
    weights = n_params * 4
    return {
        "mode": mode,
        "params": n_params,
        "largest_param": largest,
        "weights_bytes": weights,
        "grad_peak_bytes": live["peak"],
        "rss_peak_minus_loaded": peak - before,
        "rss_above_weights_and_accumulator": peak - before - weights,
        "seconds": estimate.info["seconds"],
        "completion_tokens": estimate.info["completion_tokens"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", nargs=3, metavar=("MODEL", "SUITE", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(Path(args.child[0]), Path(args.child[1]), args.child[2])))
        return
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        suite = root / "suite"
        suite.mkdir()
        (suite / "data.jsonl").write_text("".join(json.dumps({"prompt": p, "answer": ""}) + "\n" for p in PROMPTS))
        (suite / "suite.yaml").write_text("name: calib\nmax_new_tokens: 16\nchat_template: false\n")
        for name, layers in SIZES.items():
            write_model(root / name, layers)
            for mode in ("hooks", "textbook"):
                env = dict(os.environ, RAM_DESKTOP_CACHE=str(root / "cache"), PYTHONPATH=str(ROOT))
                out = subprocess.run(
                    [sys.executable, __file__, "--child", str(root / name), str(suite), mode],
                    capture_output=True,
                    text=True,
                    env=env,
                    check=True,
                )
                row = json.loads(out.stdout.strip().splitlines()[-1])
                row["model"] = name
                results.append(row)
                mb = 1e6
                print(
                    f"{name:6s} {mode:9s} params {row['params'] / 1e6:5.1f}M  largest {row['largest_param'] / 1e6:4.2f}M  "
                    f"weights {row['weights_bytes'] / mb:6.1f} MB  grad peak {row['grad_peak_bytes'] / mb:6.1f} MB  "
                    f"RSS above weights+F {row['rss_above_weights_and_accumulator'] / mb:6.1f} MB  "
                    f"{row['seconds']:.1f} s",
                    flush=True,
                )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
