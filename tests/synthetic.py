"""Synthetic RL-like checkpoints: a small Qwen2-style base and agents, generated deterministically.

Nothing here is learned: the task vectors only mimic the paper's agents' statistics (section 3.2):
updates of one to three bf16 ulps; one agent very sparse (about 3 %) and mostly overlapping the
others, two dense (about 46 % and 54 %) with large unique shares. The tests use them as
fixtures of known shape; the built-in demo (``ram_desktop.core.demo``) ships real RL-trained agents instead.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

CONFIG = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 128,
    "intermediate_size": 344,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 512,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "bfloat16",
}
AGENTS = {"coder": 0.495, "tool": 0.58, "memory": 0.032}  # name -> share of elements moved (ε hides ~7 %)
SPARSE_OVERLAP = 0.85  # share of the sparse agent's updates placed where a dense agent also updates
SEED = 2601


def demo_shapes(config: dict = CONFIG) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of a Qwen2 model with this config."""
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    q = config["num_attention_heads"] * config["head_dim"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h)}
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        shapes.update(
            {
                p + "self_attn.q_proj.weight": (q, h),
                p + "self_attn.q_proj.bias": (q,),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.k_proj.bias": (kv,),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.v_proj.bias": (kv,),
                p + "self_attn.o_proj.weight": (h, q),
                p + "mlp.gate_proj.weight": (i, h),
                p + "mlp.up_proj.weight": (i, h),
                p + "mlp.down_proj.weight": (h, i),
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
            }
        )
    shapes["model.norm.weight"] = (h,)
    shapes["lm_head.weight"] = (v, h)
    return shapes


def bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    """One unit in the last place of each bf16 value (as float32)."""
    _, exp = torch.frexp(x.float())
    return torch.ldexp(torch.ones_like(x, dtype=torch.float32), exp - 8)


def rl_update(base: torch.Tensor, mask: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """base + k ulps (k in ±1..3, mostly ±1) where ``mask``; exactly representable in bf16."""
    u = torch.rand(base.shape, generator=gen) * 2 - 1  # sign from the sign, size from the magnitude
    k = 1.0 + (u.abs() > 0.6).float() + (u.abs() > 0.9).float()  # 1 ulp 60 %, 2 ulps 30 %, 3 ulps 10 %
    step = torch.copysign(k, u) * bf16_ulp(base)
    return torch.where(mask, (base.float() + step).to(torch.bfloat16), base)


def generate_tensors(
    shapes: dict[str, tuple[int, ...]], seed: int = SEED, agents: dict[str, float] = AGENTS
) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
    """Base and agent tensors. The last agent is the sparse one; the others are dense and independent."""
    gen = torch.Generator().manual_seed(seed)
    names = list(agents)
    base: dict[str, torch.Tensor] = {}
    out: dict[str, dict[str, torch.Tensor]] = {n: {} for n in names}
    for tensor_name, shape in shapes.items():
        if tensor_name.endswith("norm.weight"):
            b = (1.0 + 0.05 * torch.randn(shape, generator=gen)).to(torch.bfloat16)
        else:
            b = (0.02 * torch.randn(shape, generator=gen)).to(torch.bfloat16)
        base[tensor_name] = b
        dense_masks = []
        for agent in names:
            density = agents[agent]
            if density >= 0.2:
                mask = torch.rand(shape, generator=gen) < density
                dense_masks.append(mask)
            else:
                union = torch.zeros(shape, dtype=torch.bool)
                for m in dense_masks:
                    union |= m
                u = torch.rand(shape, generator=gen)
                inside = union & (u < density * SPARSE_OVERLAP / max(union.float().mean().item(), 1e-9))
                outside = ~union & (u < density * (1 - SPARSE_OVERLAP) / max(1 - union.float().mean().item(), 1e-9))
                mask = inside | outside
            out[agent][tensor_name] = rl_update(b, mask, gen)
    return base, out


def write_model(folder: Path, tensors: dict[str, torch.Tensor], config: dict = CONFIG, shards: int = 1) -> Path:
    """Write a Hugging Face model folder: config, tokenizer, and one or ``shards`` safetensors files."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_tokenizer(folder, config["vocab_size"])
    (folder / "generation_config.json").write_text(
        json.dumps(
            {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"], "max_new_tokens": 32}
        )
    )
    names = list(tensors)
    if shards <= 1:
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return folder
    per = -(-len(names) // shards)
    weight_map = {}
    for s in range(shards):
        part = names[s * per : (s + 1) * per]
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in part}, str(folder / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
    )
    return folder


def write_tokenizer(folder: Path, vocab_size: int) -> None:
    """A small word-level tokenizer (tokenizers JSON format) that transformers loads."""
    special = ["<unk>", "<s>", "</s>", "<pad>"]
    words = [
        "the",
        "a",
        "an",
        "agent",
        "tool",
        "code",
        "memory",
        "search",
        "math",
        "merge",
        "model",
        "base",
        "task",
        "vector",
        "update",
        "reward",
        "policy",
        "step",
        "plan",
        "call",
        "result",
        "answer",
        "question",
        "data",
        "file",
        "run",
        "test",
        "pass",
        "fail",
    ]
    vocab = {tok: i for i, tok in enumerate(special + words)}
    for i in range(len(vocab), vocab_size):
        vocab[f"w{i}"] = i
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": t,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i, t in enumerate(special)
        ],
        "normalizer": {"type": "Lowercase"},
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "unk_token": "<unk>",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "pad_token": "<pad>",
                "model_max_length": 512,
                "chat_template": "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}",
            }
        )
    )
    (folder / "special_tokens_map.json").write_text(
        json.dumps({"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"})
    )


def write_synthetic(folder: Path | str, seed: int = SEED) -> tuple[Path, list[Path]]:
    """Write a synthetic ``base/`` and one folder per agent under ``folder``; return (base, agents)."""
    folder = Path(folder)
    base, agents = generate_tensors(demo_shapes(), seed)
    base_dir = write_model(folder / "base", base)
    agent_dirs = [
        write_model(folder / name, tensors, shards=2 if name == "tool" else 1) for name, tensors in agents.items()
    ]
    return base_dir, agent_dirs
