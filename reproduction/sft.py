"""Stage 1: the base model, a Qwen2ForCausalLM trained from scratch on the three tasks (supervised)."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import torch
from common import MODEL_CONFIG, load_tokenizer, score, seed_everything
from tasks import MIXTURE, TASKS, make_split
from tokenizer import save_tokenizer


def encode_batch(tokenizer, examples: list[dict]):
    """Right-padded prompt+answer+end ids; the loss covers the answer and end token only."""
    seqs, labels = [], []
    for e in examples:
        p = tokenizer(e["prompt"])["input_ids"]
        a = tokenizer(e["answer"])["input_ids"] + [tokenizer.eos_token_id]
        seqs.append(p + a)
        labels.append([-100] * len(p) + a)
    n = max(map(len, seqs))
    ids = torch.full((len(seqs), n), tokenizer.pad_token_id)
    lab = torch.full((len(seqs), n), -100)
    mask = torch.zeros((len(seqs), n), dtype=torch.long)
    for i, (s, l) in enumerate(zip(seqs, labels)):
        ids[i, : len(s)] = torch.tensor(s)
        lab[i, : len(l)] = torch.tensor(l)
        mask[i, : len(s)] = 1
    return ids, mask, lab


def train_base(
    out: Path,
    seed: int,
    steps: int,
    batch_size: int = 32,
    lr: float = 2e-3,
    log=print,
    eval_every: int = 0,
    eval_sets: dict | None = None,
) -> Path:
    """Train the base and save it in bf16 (the tensor format RL checkpoints ship in)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    seed_everything(seed)
    save_tokenizer(out)
    tokenizer = load_tokenizer(out)
    model = Qwen2ForCausalLM(Qwen2Config(**MODEL_CONFIG)).float()
    train = {t: make_split(t, "train", 2000, seed) for t in TASKS}
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 100) * max(0.05, 1 - s / max(steps, 1)))
    start = time.time()
    for step in range(1, steps + 1):
        model.train()
        tasks = rng.choices(TASKS, weights=[MIXTURE[t] for t in TASKS], k=batch_size)
        batch = [rng.choice(train[t]) for t in tasks]
        ids, mask, lab = encode_batch(tokenizer, batch)
        loss = model(input_ids=ids, attention_mask=mask, labels=lab).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0 or step == steps:
            log(f"sft step {step}/{steps} loss {loss.item():.4f} ({time.time() - start:.0f} s)")
        if eval_every and eval_sets and step % eval_every == 0:
            log("  " + " ".join(f"{t}={score(model, tokenizer, t, ex):.3f}" for t, ex in eval_sets.items()))
    model.config.dtype = torch.bfloat16
    model.to(torch.bfloat16).save_pretrained(str(out))
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "do_sample": False})
    )
    return out
