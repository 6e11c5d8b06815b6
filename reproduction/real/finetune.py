"""A few supervised Adam steps on chat examples from the real base: small real fine-tunes in minutes on a CPU.

Used where real weights matter but GRPO would take too long: the CI test of the engine on the real model
(``tests/test_real_model.py``) and the speed benchmark's three 135M agents (``benchmarks/make_real_agents.py``).
float32 master weights loaded from the bf16 base, the loss on the assistant's answer only, saved in bf16 (an
element whose update stays under half a bf16 ulp rounds back to the base value)."""

from __future__ import annotations

from pathlib import Path

import torch


def chat(tokenizer, system: str, question: str, answer: str | None = None) -> str:
    """One chat example through the tokenizer's chat template (with the generation prompt when no answer)."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    if answer is None:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.apply_chat_template(messages + [{"role": "assistant", "content": answer}], tokenize=False)


def batch(tokenizer, system: str, pairs: list[tuple[str, str]]) -> dict[str, torch.Tensor]:
    """Left-padded chat examples with the loss on the assistant's answer only."""
    rows = []
    for question, answer in pairs:
        prompt = tokenizer(chat(tokenizer, system, question), add_special_tokens=False)["input_ids"]
        full = tokenizer(chat(tokenizer, system, question, answer), add_special_tokens=False)["input_ids"]
        assert full[: len(prompt)] == prompt
        rows.append((full, [-100] * len(prompt) + full[len(prompt) :]))
    width = max(len(ids) for ids, _ in rows)
    pad = tokenizer.pad_token_id

    def left(values: list[int], fill: int) -> list[int]:
        return [fill] * (width - len(values)) + values

    return {
        "input_ids": torch.tensor([left(ids, pad) for ids, _ in rows]),
        "labels": torch.tensor([left(labels, -100) for _, labels in rows]),
        "attention_mask": torch.tensor([left([1] * len(ids), 0) for ids, _ in rows]),
    }


def finetune(base: Path, system: str, pairs: list[tuple[str, str]], out: Path, steps: int, lr: float) -> None:
    """``steps`` Adam steps on ``pairs`` (one batch) from ``base``; the result saved in bf16 to ``out``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    examples = batch(tokenizer, system, pairs)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, fused=True)
    for step in range(steps):
        loss = model(**examples).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"[finetune] {out.name} step {step}: loss {loss.item():.3f}", flush=True)
    model.to(torch.bfloat16).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
