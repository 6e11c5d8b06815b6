"""Shared pieces: the model shape, seeding, loading a saved model, greedy scoring on a suite."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent

MODEL_CONFIG = {
    "vocab_size": 64,
    "hidden_size": 64,
    "intermediate_size": 192,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
MAX_NEW_TOKENS = {"code": 5, "tool": 24, "memory": 4}  # longest answer + end token, with room


def seed_everything(seed: int, threads: int | None = None) -> None:
    """Seed Python, NumPy and torch; fix the thread count so CPU reductions repeat bit for bit."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(threads or int(os.environ.get("REPRO_THREADS", "1")))
    torch.use_deterministic_algorithms(True, warn_only=True)


def load_tokenizer(folder: Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    tok.padding_side = "left"
    return tok


def load_model(folder: Path, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


@torch.no_grad()
def generate(model, tokenizer, prompts: list[str], max_new_tokens: int, batch_size: int = 128) -> list[str]:
    """Greedy completions (decoded, special tokens dropped), batched with left padding."""
    model.eval()
    out: list[str] = []
    for i in range(0, len(prompts), batch_size):
        batch = tokenizer(prompts[i : i + batch_size], return_tensors="pt", padding=True)
        ids = model.generate(
            **batch,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        out += tokenizer.batch_decode(ids[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    return out


def rewards(model, tokenizer, task: str, examples: list[dict]) -> tuple[list[float], list[float]]:
    """Per example: the task's own reward of the greedy completion, and exact match (1.0 or 0.0)."""
    import reward

    prompts, answers = [e["prompt"] for e in examples], [e["answer"] for e in examples]
    completions = generate(model, tokenizer, prompts, MAX_NEW_TOKENS[task])
    return (
        getattr(reward, reward.REWARDS[task])(prompts, completions, answer=answers),
        reward.exact_match(prompts, completions, answer=answers),
    )


def score(model, tokenizer, task: str, examples: list[dict], with_exact: bool = False):
    """Mean reward of greedy completions with the task's own reward function (and, with
    ``with_exact``, the share answered exactly right as well)."""
    values, exact = rewards(model, tokenizer, task, examples)
    mean = float(sum(values) / max(len(values), 1))
    if not with_exact:
        return mean
    return mean, float(sum(exact) / max(len(exact), 1))


def paired_gain(before: list[float], after: list[float]) -> dict[str, float]:
    """The mean of after − before over the same examples and its standard error (sample sd / √n):
    the gain is clear when it exceeds twice the standard error."""
    diffs = [a - b for a, b in zip(after, before, strict=True)]
    n = len(diffs)
    mean = sum(diffs) / n
    sd = (sum((d - mean) ** 2 for d in diffs) / (n - 1)) ** 0.5 if n > 1 else 0.0
    return {"gain": mean, "se": sd / n**0.5, "n": n}
