"""The three toy agent tasks (code, tool, memory): example generators, seeded and disjoint by split.

Each example is ``{"prompt": str, "answer": str}``; the model must write the answer and stop.
The prompts share one character alphabet (see ``tokenizer.py``) so one small model learns all three.
"""

from __future__ import annotations

import random

TASKS = ("code", "tool", "memory")
SPLITS = {"train": 0, "validation": 1, "test": 2}  # each split draws from its own seeded stream

TOOLS = {"weather": "weather in", "search": "look up", "email": "write to", "timer": "set a timer for"}
WORDS = [
    "paris",
    "oslo",
    "rome",
    "lima",
    "kyiv",
    "cats",
    "dogs",
    "jazz",
    "tea",
    "rust",
    "maths",
    "anna",
    "bob",
    "eve",
    "lee",
    "tom",
    "ten",
    "five",
    "nine",
    "noon",
    "dawn",
    "rain",
    "snow",
    "gold",
    "jade",
]
KEYS = "abcdefghijklmnopqrstuvwxyz"


def code_example(rng: random.Random) -> dict:
    """Run a two-line program and print the variable: ``x=47;x=x+5;x`` -> ``52``."""
    x, op, d = rng.randint(10, 99), rng.choice("+-"), rng.randint(1, 9)
    result = x + d if op == "+" else x - d
    return {"prompt": f"code: x={x};x=x{op}{d};x =", "answer": str(result)}


def tool_example(rng: random.Random) -> dict:
    """Emit a call naming the right tool with the argument copied: ``weather in oslo`` -> ``weather(oslo)``."""
    tool = rng.choice(list(TOOLS))
    arg = rng.choice(WORDS)
    if rng.random() < 0.5:
        arg = arg + " " + rng.choice(WORDS)
    return {"prompt": f"tool: {TOOLS[tool]} {arg} >", "answer": f"{tool}({arg})"}


def memory_example(rng: random.Random) -> dict:
    """Recall one value from a long key-value context: ``k=7 q=2 ... ? q`` -> ``2``."""
    keys = rng.sample(KEYS, 4)
    values = [str(rng.randint(10, 99)) for _ in keys]
    context = " ".join(f"{k}={v}" for k, v in zip(keys, values))
    i = rng.randrange(len(keys))
    return {"prompt": f"memory: {context} ? {keys[i]} =", "answer": values[i]}


GENERATORS = {"code": code_example, "tool": tool_example, "memory": memory_example}
# Share of each task in the base's supervised mixture: tool calls are learned fastest, so they get
# less of it and all three tasks stay partly solved (room for RL).
MIXTURE = {"code": 0.34, "tool": 0.06, "memory": 0.6}


def make_split(task: str, split: str, n: int, seed: int) -> list[dict]:
    """``n`` examples of ``task``; validation and test never repeat a train prompt."""
    rng = random.Random(f"{seed}-{task}-{split}")
    seen: set[str] = set()
    if split != "train":
        train_rng = random.Random(f"{seed}-{task}-train")
        seen = {GENERATORS[task](train_rng)["prompt"] for _ in range(2000)}
    out: list[dict] = []
    prompts: set[str] = set()
    tries = 0
    while len(out) < n and tries < 100 * n:
        tries += 1
        ex = GENERATORS[task](rng)
        if ex["prompt"] in seen or (split != "train" and ex["prompt"] in prompts):
            continue
        prompts.add(ex["prompt"])
        out.append(ex)
    return out
