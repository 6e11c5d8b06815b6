"""Stage 2: one agent per task, RL-trained from the base with TRL's GRPOTrainer, saved in bf16.

The weights train in float32 (master weights) from the bf16 base and are saved in bf16, as real RL
checkpoints are: an element whose total update stays under half a bf16 ulp rounds back to the base
value, which is what makes RL task vectors sparse. Each agent's recipe says which parameters get
gradient and how large its steps are; see ``RECIPES`` and reproduction/README.md.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from common import MAX_NEW_TOKENS, load_model, load_tokenizer, seed_everything
from tasks import make_split

PROMPTS_PER_STEP = 16  # each with 8 sampled completions: 128 per optimizer step


@dataclass(frozen=True)
class Recipe:
    """How one agent is trained: learning rate, optimizer steps, and which tensors receive gradient."""

    learning_rate: float
    steps: int
    trainable: str  # a regular expression over parameter names

    def as_dict(self) -> dict:
        return {"learning_rate": self.learning_rate, "steps": self.steps, "trainable": self.trainable}


# Partly overlapping parameter groups (so the merge has both unique and shared regions), like the
# paper's agents whose updates land on different, partly shared elements.
RECIPES = {
    "code": Recipe(3e-4, 250, r"model\.layers\.[12]\.mlp\."),
    "tool": Recipe(5e-4, 200, r"model\.layers\.\d+\.self_attn\.|model\.layers\.2\.mlp\."),
    "memory": Recipe(7e-4, 200, r"model\.layers\.\d+\.self_attn\.|model\.layers\.0\.mlp\."),
}


def train_agent(
    base: Path, task: str, out: Path, seed: int, recipe: Recipe, log=print, workdir: Path | None = None
) -> Path:
    """GRPO on ``task`` from ``base``; the result is a complete bf16 model folder at ``out``."""
    import reward
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    seed_everything(seed)
    tokenizer = load_tokenizer(base)
    model = load_model(base, torch.float32)  # float32 master weights, starting from the bf16 values
    pattern = re.compile(recipe.trainable)
    trained = 0
    for name, p in model.named_parameters():
        p.requires_grad_(bool(pattern.search(name)))
        trained += p.numel() if p.requires_grad else 0
    if not trained:
        raise ValueError(f"recipe for {task} selects no parameters: {recipe.trainable}")
    train = Dataset.from_list(make_split(task, "train", 2000, seed))
    workdir = workdir or out.parent / f".grpo-{task}"
    config = GRPOConfig(
        output_dir=str(workdir),
        learning_rate=recipe.learning_rate,
        max_steps=recipe.steps,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        per_device_train_batch_size=PROMPTS_PER_STEP * 8,
        num_generations=8,
        generation_batch_size=PROMPTS_PER_STEP * 8,
        max_completion_length=MAX_NEW_TOKENS[task],
        temperature=1.0,
        beta=0.0,
        logging_steps=25,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=seed,
        data_seed=seed,
        gradient_checkpointing=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=getattr(reward, reward.REWARDS[task]),
        args=config,
        train_dataset=train,
        processing_class=tokenizer,
    )
    start = time.time()
    trainer.train()
    seconds = time.time() - start
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    log(
        f"grpo {task}: {recipe.steps} steps in {seconds:.0f} s "
        f"({recipe.steps / seconds:.1f} steps/s); train reward {rewards[0] if rewards else 'n/a'} -> "
        f"{rewards[-1] if rewards else 'n/a'}"
    )
    model = trainer.model
    model.config.dtype = torch.bfloat16
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        if (base / f).exists():
            shutil.copy(base / f, out / f)  # the base's own files: every model reads text alike
    (out / "recipe.json").write_text(
        json.dumps(
            {
                "task": task,
                "seed": seed,
                "trained_parameters": trained,
                "seconds": round(seconds, 1),
                "train_reward_curve": rewards,
                **recipe.as_dict(),
            },
            indent=2,
        )
    )
    shutil.rmtree(workdir, ignore_errors=True)
    return out
