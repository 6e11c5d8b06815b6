"""One real agent: SmolLM2-135M-Instruct RL-trained on one chat task with TRL 1.16's ``GRPOTrainer``.

β = 0 (no reference model), float32 master weights loaded from the bf16 base, a small constant learning
rate, every parameter trainable, saved in **bf16**: an element whose total update stays under half a bf16
ulp rounds back to the base value — the mechanism that makes RL task vectors sparse (the paper's regime).
The prompts are conversations (the task's system prompt and the user turn), so TRL applies the chat
template exactly as ``ram-merge eval`` does for a suite with ``chat_template: true``.

On a GPU the only differences are the device and the batch sizes (``Recipe``).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from . import reward
from .tasks import MAX_NEW_TOKENS, SYSTEM


@dataclass(frozen=True)
class Recipe:
    """How one agent is trained."""

    learning_rate: float = 1e-5
    steps: int = 48
    prompts_per_step: int = 16
    generations: int = 8  # completions sampled per prompt (GRPO's group)
    temperature: float = 1.0


def conversation(task: str, prompt: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM[task]}, {"role": "user", "content": prompt}]


def train_agent(
    base: Path,
    task: str,
    train_rows: list[dict],
    out: Path,
    seed: int,
    recipe: Recipe,
    device: str,
    log: Callable[[str], None] = print,
) -> Path:
    """GRPO on ``task`` from ``base``; a complete bf16 model folder at ``out`` (written beside it, renamed last)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)  # float32 master weights
    train = Dataset.from_list([{"prompt": conversation(task, r["prompt"]), "answer": r["answer"]} for r in train_rows])
    staging = out.parent / f".{out.name}.staging"
    shutil.rmtree(staging, ignore_errors=True)
    batch = recipe.prompts_per_step * recipe.generations
    if batch > 32 and batch % 32:
        raise ValueError(f"prompts_per_step × generations must be at most 32 or a multiple of 32, got {batch}")
    config = GRPOConfig(
        output_dir=str(staging / "trainer"),
        learning_rate=recipe.learning_rate,
        max_steps=recipe.steps,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        # micro-batches of at most 32 completions, accumulated to one optimizer step per generation round
        per_device_train_batch_size=min(batch, 32),
        gradient_accumulation_steps=max(1, batch // 32),
        num_generations=recipe.generations,
        max_completion_length=MAX_NEW_TOKENS[task],
        temperature=recipe.temperature,
        beta=0.0,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=device == "cpu",
        bf16=False,
        seed=seed,
        data_seed=seed,
        gradient_checkpointing=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    started = time.time()

    class LogSteps(TrainerCallback):  # one line per optimizer step, for polling a long run
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                log(
                    f"grpo {task} seed {seed}: step {state.global_step}/{recipe.steps} reward {logs['reward']:.3f} "
                    f"({time.time() - started:.0f} s)"
                )

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=getattr(reward, reward.REWARDS[task]),
        args=config,
        train_dataset=train,
        processing_class=tokenizer,
        callbacks=[LogSteps()],
    )
    trainer.train()
    seconds = time.time() - started
    curve = [round(h["reward"], 4) for h in trainer.state.log_history if "reward" in h]
    log(
        f"grpo {task} seed {seed}: {recipe.steps} steps in {seconds:.0f} s; sampled reward "
        f"{curve[0] if curve else 'n/a'} -> {curve[-1] if curve else 'n/a'}"
    )
    trained = trainer.model
    trained.config.dtype = torch.bfloat16
    trained.to(torch.bfloat16).save_pretrained(str(staging / "model"))
    for f in base.iterdir():  # the base's own tokenizer, chat template and generation files: all read text alike
        if (
            f.is_file()
            and f.suffix != ".safetensors"
            and f.name not in ("config.json", "model.safetensors.index.json", "ram-real-base.json")
        ):
            shutil.copy(f, staging / "model" / f.name)
    (staging / "model" / "recipe.json").write_text(
        json.dumps(
            {
                "task": task,
                "seed": seed,
                "device": device,
                "seconds": round(seconds, 1),
                "train_reward_curve": curve,
                "trained_parameters": sum(p.numel() for p in trained.parameters()),
                "trainable": "all parameters",
                **asdict(recipe),
            },
            indent=2,
        )
    )
    shutil.rmtree(out, ignore_errors=True)
    (staging / "model").rename(out)
    shutil.rmtree(staging, ignore_errors=True)
    return out
