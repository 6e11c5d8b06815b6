#!/usr/bin/env python3
"""Three real 135M agents for ``bench_merge.py``: SmolLM2-135M-Instruct (bf16, dequantised from a 4-bit GGUF)
and three small supervised fine-tunes of it (a few Adam steps each on a tiny chat task, saved in bf16).

The speed of a merge depends on the shapes, the dtype and how many elements each agent changed, not on how
the agents were trained, so these stand in for the GRPO agents of ``reproduction/real`` (which stay on the
machine that trained them). Writes ``OUT/base`` (a copy of the built base) and ``OUT/{code,tool,memory}``.

    .venv/bin/python benchmarks/make_real_agents.py --out /work/bench-real
    .venv/bin/python benchmarks/bench_merge.py --data /work/bench-real --methods ram-plus,ties
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root, for reproduction/
from reproduction.real import base as real_base
from reproduction.real.finetune import finetune

SYSTEM = "Be brief."
TASKS = {  # agent name (bench_merge's) -> a few chat examples, one batch
    "code": [
        ("What does print(2 + 3) print?", "5"),
        ("What does print(len('abc')) print?", "3"),
        ("What does print(4 * 2) print?", "8"),
        ("What does print(10 - 7) print?", "3"),
    ],
    "tool": [
        ("Weather in Oslo?", "weather(Oslo)"),
        ("Search for cheap flights", "search(cheap flights)"),
        ("Set a timer for 5 minutes", "timer(5 minutes)"),
        ("Email Ann: running late", "email(Ann)"),
    ],
    "memory": [
        ("a=4, b=9. What is b?", "9"),
        ("x=1, y=7. What is x?", "1"),
        ("k=3, m=8. What is m?", "8"),
        ("p=6, q=2. What is p?", "6"),
    ],
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=3, help="Adam steps per agent (default 3)")
    ap.add_argument("--lr", type=float, default=1e-5)
    args = ap.parse_args()
    built = real_base.default_out()
    if not real_base.is_built(built):
        real_base.build_base(built)
    base = args.out / "base"
    if not real_base.is_built(base):
        shutil.copytree(built, base, dirs_exist_ok=True)
    for name, pairs in TASKS.items():
        if not (args.out / name / "config.json").exists():
            finetune(base, SYSTEM, pairs, args.out / name, args.steps, args.lr)
    print(f"base and agents {', '.join(TASKS)} in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
