#!/usr/bin/env python3
"""Generate a synthetic RL-like base model and three "agents" in the Hugging Face layout.

The checkpoints mimic what the RAM paper (arXiv 2601.13572, section 3.2 / figure 2) measured on
RL-trained agents of one base model:

* every update is a few bf16 ulps: agent = base moved by k ulps, k in {+-1, +-2, +-3}
  (60 % / 30 % / 10 % for |k| = 1 / 2 / 3), done on the bf16 bit pattern so it is exact;
* ``code``   is very sparse (~3.2 % of elements updated) and mostly overlaps the others
  (~6 % of its updates are unique);
* ``tool``   is dense (~46.2 %) with ~41 % of its updates unique;
* ``memory`` is dense (~54.3 %) with ~47.5 % of its updates unique.

The masks come from one uniform draw per element that picks a region of the 3-set Venn diagram,
so the three agents' update sets have exactly those expected densities and overlaps.  (With the
default eps = 1e-5 a probe counts slightly fewer updates: a 1-ulp change of a weight smaller than
about 1.3e-3 is below eps, as it would be for a real checkpoint.)

Layout per model folder: ``config.json`` (Qwen2ForCausalLM), ``generation_config.json``,
bf16 safetensors (``model.safetensors`` or ``model-0000i-of-0000n.safetensors`` plus
``model.safetensors.index.json`` when the model exceeds ``--shard-size``), metadata
``format: pt``.  Output: ``OUT/base``, ``OUT/code``, ``OUT/tool``, ``OUT/memory`` and
``OUT/agents.json`` (generator settings and the expected statistics).

Generation is tensor by tensor and shard by shard: only one shard of each of the four models is
in memory at a time.  Output is deterministic for a given seed and size (each tensor has its own
RNG stream derived from the seed and the tensor name).

    python benchmarks/make_agents.py --params 300M --out /work/bench-data
    python benchmarks/make_agents.py --params 20M --out /tmp/agents-20m --seed 1
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
import zlib
from dataclasses import dataclass

import torch
from safetensors.torch import save_file

AGENTS = ("code", "tool", "memory")
# Target densities and unique shares (fraction of an agent's updates that no other agent makes),
# from the paper's figure 2 (Qwen2.5-7B-Instruct agents).
DENSITY = {"code": 0.032, "tool": 0.462, "memory": 0.543}
UNIQUE_SHARE = {"code": 0.063, "tool": 0.408, "memory": 0.475}

# |k| distribution of the ulp steps, as a lookup over randint(0, 20): even r -> +, odd r -> -.
_K_TABLE = [(1 if (r // 2) < 6 else 2 if (r // 2) < 9 else 3) * (1 if r % 2 == 0 else -1) for r in range(20)]


def venn_regions() -> list[tuple[frozenset, float]]:
    """Probabilities of the 7 non-empty regions of the (code, tool, memory) Venn diagram.

    Solves the target densities / unique shares: unique parts are fixed; the code agent's
    shared part is split between code&tool, code&memory and all three so that tool's and
    memory's shared totals come out right; the rest of tool/memory overlap is tool&memory.
    """
    pa, pb, pc = (DENSITY[a] for a in AGENTS)
    a = UNIQUE_SHARE["code"] * pa
    b = UNIQUE_SHARE["tool"] * pb
    c = UNIQUE_SHARE["memory"] * pc
    a_shared = pa - a  # ab + ac + abc
    b_shared = pb - b  # ab + bc + abc
    c_shared = pc - c  # ac + bc + abc
    diff = c_shared - b_shared  # = ac - ab
    abc = 0.28 * a_shared
    ab = (a_shared - abc - diff) / 2
    ac = ab + diff
    bc = b_shared - ab - abc
    regions = [
        (frozenset({"code"}), a),
        (frozenset({"tool"}), b),
        (frozenset({"memory"}), c),
        (frozenset({"code", "tool"}), ab),
        (frozenset({"code", "memory"}), ac),
        (frozenset({"tool", "memory"}), bc),
        (frozenset(AGENTS), abc),
    ]
    assert all(p > 0 for _, p in regions), regions
    return regions


# ---------------------------------------------------------------------------------------------
# model shape


@dataclass
class Dims:
    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def tensors(self) -> list[tuple[str, tuple[int, ...], str]]:
        """(name, shape, kind) in Hugging Face order; kind picks the base initialisation."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        out = [("model.embed_tokens.weight", (self.vocab, h), "w")]
        for i in range(self.layers):
            p = f"model.layers.{i}."
            out += [
                (p + "input_layernorm.weight", (h,), "norm"),
                (p + "mlp.down_proj.weight", (h, self.intermediate), "w"),
                (p + "mlp.gate_proj.weight", (self.intermediate, h), "w"),
                (p + "mlp.up_proj.weight", (self.intermediate, h), "w"),
                (p + "post_attention_layernorm.weight", (h,), "norm"),
                (p + "self_attn.k_proj.bias", (kv,), "bias"),
                (p + "self_attn.k_proj.weight", (kv, h), "w"),
                (p + "self_attn.o_proj.weight", (h, h), "w"),
                (p + "self_attn.q_proj.bias", (h,), "bias"),
                (p + "self_attn.q_proj.weight", (h, h), "w"),
                (p + "self_attn.v_proj.bias", (kv,), "bias"),
                (p + "self_attn.v_proj.weight", (kv, h), "w"),
            ]
        out += [("model.norm.weight", (h,), "norm"), ("lm_head.weight", (self.vocab, h), "w")]
        return out

    def n_params(self) -> int:
        return sum(math.prod(s) for _, s, _ in self.tensors())

    def config(self) -> dict:
        return {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "attention_dropout": 0.0,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "hidden_act": "silu",
            "hidden_size": self.hidden,
            "initializer_range": 0.02,
            "intermediate_size": self.intermediate,
            "max_position_embeddings": 4096,
            "max_window_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_hidden_layers": self.layers,
            "num_key_value_heads": self.kv_heads,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "sliding_window": None,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "use_cache": True,
            "use_sliding_window": False,
            "vocab_size": self.vocab,
        }


def _round_to(x: float, m: int) -> int:
    return max(m, round(x / m) * m)


# published layouts (``--layout``): every dimension as the model's config.json gives it
LAYOUTS = {
    "qwen2-1.5b": {"hidden": 1536, "layers": 28, "intermediate": 8960, "vocab": 151936, "heads": 12, "kv_heads": 2},
}


def dims_for(params: int, hidden=None, layers=None, vocab=None, intermediate=None, heads=None, kv_heads=None) -> Dims:
    """Pick Qwen2-like dims whose parameter count lands near ``params``.

    hidden from a ladder (head_dim 64, kv heads = heads/4, intermediate ~2.25*hidden rounded to
    128, vocab 32000 from 100M up, else 8000); the largest hidden whose layer count is still at
    least hidden/64 wins (1024 x 24 layers for 300M).  Any dim can be forced.
    """
    if hidden and layers and vocab and intermediate and heads and kv_heads:
        return Dims(hidden, layers, intermediate, heads, kv_heads, vocab)
    v = vocab or (32000 if params >= 100e6 else 8000)
    ladder = (
        [hidden]
        if hidden
        else [128, 256, 384, 512, 640, 768, 896, 1024, 1280, 1536, 2048, 2560, 3072, 3584, 4096, 5120, 8192]
    )
    best = None
    for h in ladder:
        heads = max(1, h // 64)
        kv = max(d for d in range(1, heads + 1) if heads % d == 0 and d <= max(1, heads // 4))
        inter = intermediate or _round_to(2.25 * h, 128)
        d = Dims(h, 1, inter, heads, kv, v)
        emb = 2 * v * h + h
        per_layer = Dims(h, 2, inter, heads, kv, v).n_params() - d.n_params()
        n_layers = layers or max(1, round((params - emb) / per_layer))
        d = Dims(h, n_layers, inter, heads, kv, v)
        ok = layers is not None or n_layers >= max(2, h // 64)
        if best is None or ok:
            best = d
    return best


def parse_size(text: str) -> int:
    """'300M', '1.5B' (billion), '20000000', '250MB', '5GB' -> int."""
    t = text.strip().upper()
    if len(t) > 2 and t.endswith("B") and t[-2] in "KMGT":
        t = t[:-1]
    mult = {"K": 1e3, "M": 1e6, "G": 1e9, "B": 1e9, "T": 1e12}
    if t and t[-1] in mult:
        return int(float(t[:-1]) * mult[t[-1]])
    return int(float(t))


# ---------------------------------------------------------------------------------------------
# tensors


def _gen(seed: int, name: str, stream: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode()) * 16 + stream) % (2**63))
    return g


def make_tensor_set(name: str, shape, kind: str, seed: int, region_cdf, region_masks, k_table) -> list[torch.Tensor]:
    """Return [base, code, tool, memory] bf16 tensors for one parameter."""
    n = math.prod(shape)
    g = _gen(seed, name, 0)
    x = torch.randn(n, generator=g, dtype=torch.float32)
    if kind == "norm":
        x.mul_(0.05).add_(1.0)
    else:
        x.mul_(0.02)
    base = x.to(torch.bfloat16)
    del x
    bits = base.view(torch.int16)
    # no exact zeros (a -k step from +0 would wrap into NaN bit patterns)
    bits.masked_fill_(bits == 0, 0x3A83)  # ~1e-3
    bits.masked_fill_(bits == -32768, 0x3A83)  # -0.0

    g = _gen(seed, name, 1)
    u = torch.rand(n, generator=g, dtype=torch.float32)
    region = torch.bucketize(u, region_cdf, right=True)  # 0..6 regions, 7 = untouched
    del u
    out = [base.reshape(shape)]
    for j, _agent in enumerate(AGENTS):
        g = _gen(seed, name, 2 + j)
        r = torch.randint(0, 20, (n,), generator=g, dtype=torch.int64)
        k = k_table[r]
        del r
        k.mul_(region_masks[j][region])
        out.append((bits + k).view(torch.bfloat16).reshape(shape))
        del k
    return out


def plan_shards(tensors, max_shard_bytes: int) -> list[list[tuple]]:
    shards, cur, size = [], [], 0
    for t in tensors:
        nbytes = 2 * math.prod(t[1])
        if cur and size + nbytes > max_shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append(t)
        size += nbytes
    if cur:
        shards.append(cur)
    return shards


def generate(
    out: str,
    params: int = 300_000_000,
    seed: int = 0,
    shard_size: int = 250_000_000,
    force: bool = False,
    quiet: bool = False,
    **dim_overrides,
) -> dict:
    dims = dims_for(params, **dim_overrides)
    models = ("base",) + AGENTS
    info_path = os.path.join(out, "agents.json")
    settings = {"params_target": params, "seed": seed, "shard_size": shard_size, "dims": dims.__dict__}
    if not force and os.path.exists(info_path):
        with open(info_path) as f:
            old = json.load(f)
        if old.get("settings") == settings and all(os.path.exists(os.path.join(out, m, "config.json")) for m in models):
            if not quiet:
                print(f"{out}: already generated with these settings, reusing", file=sys.stderr)
            return old
    for m in models:
        d = os.path.join(out, m)
        if os.path.exists(d):
            shutil.rmtree(d)
        os.makedirs(d)
    if os.path.exists(info_path):
        os.remove(info_path)

    regions = venn_regions()
    cdf = torch.tensor([p for _, p in regions], dtype=torch.float64).cumsum(0).to(torch.float32)
    region_masks = [torch.tensor([1 if a in s else 0 for s, _ in regions] + [0], dtype=torch.int16) for a in AGENTS]
    k_table = torch.tensor(_K_TABLE, dtype=torch.int16)

    tensors = dims.tensors()
    shards = plan_shards(tensors, shard_size)
    n_sh = len(shards)
    weight_map = {}
    total = dims.n_params()
    t0 = time.perf_counter()
    done = 0
    for si, shard in enumerate(shards):
        fname = "model.safetensors" if n_sh == 1 else f"model-{si + 1:05d}-of-{n_sh:05d}.safetensors"
        per_model = {m: {} for m in models}
        for name, shape, kind in shard:
            ts = make_tensor_set(name, shape, kind, seed, cdf, region_masks, k_table)
            for m, t in zip(models, ts):
                per_model[m][name] = t
            weight_map[name] = fname
            done += math.prod(shape)
        for m in models:
            save_file(per_model[m], os.path.join(out, m, fname), metadata={"format": "pt"})
        del per_model
        if not quiet:
            el = time.perf_counter() - t0
            print(
                f"  shard {si + 1}/{n_sh}: {done / total:6.1%} of {total / 1e6:.1f}M params, {el:.1f}s", file=sys.stderr
            )

    cfg = dims.config()
    for m in models:
        d = os.path.join(out, m)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
        with open(os.path.join(d, "generation_config.json"), "w") as f:
            json.dump({"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}, f, indent=2)
        if n_sh > 1:
            idx = {"metadata": {"total_size": 2 * total}, "weight_map": weight_map}
            with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
                json.dump(idx, f, indent=2)

    info = {
        "format": "ram-bench-agents/1",
        "settings": settings,
        "params": total,
        "tensors": len(tensors),
        "shards": n_sh,
        "models": {m: os.path.join(out, m) for m in models},
        "expected": {
            "density": DENSITY,
            "unique_share": UNIQUE_SHARE,
            "regions": {"&".join(sorted(s)): p for s, p in regions},
            "k_abs_distribution": {"1": 0.6, "2": 0.3, "3": 0.1},
            "note": "densities are of elements changed; a probe with eps=1e-5 sees slightly "
            "fewer (1-ulp steps of |w| < ~1.3e-3 fall below eps)",
        },
        "generate_seconds": round(time.perf_counter() - t0, 2),
    }
    with open(info_path, "w") as f:
        json.dump(info, f, indent=2)
    return info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", required=True, help="output folder (base/, code/, tool/, memory/)")
    ap.add_argument("--params", default="300M", help="target parameters per model (default 300M)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--shard-size",
        default="250MB",
        help="max bytes per safetensors shard (default 250MB; larger models are "
        "sharded with model.safetensors.index.json)",
    )
    ap.add_argument("--hidden", type=int)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--intermediate", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--kv-heads", type=int)
    ap.add_argument("--layout", choices=sorted(LAYOUTS), help="a published layout's dims (overrides --params)")
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    ap.add_argument("--force", action="store_true", help="regenerate even if present")
    ap.add_argument("--dry-run", action="store_true", help="print the dims and exit")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    params = parse_size(a.params)
    over = {k: getattr(a, k) for k in ("hidden", "layers", "vocab", "intermediate", "heads", "kv_heads")}
    if a.layout:
        over.update(LAYOUTS[a.layout])
    dims = dims_for(params, **over)
    print(f"dims: {dims} -> {dims.n_params() / 1e6:.1f}M params/model", file=sys.stderr)
    if a.dry_run:
        return 0
    t0 = time.perf_counter()
    info = generate(a.out, params, a.seed, parse_size(a.shard_size), force=a.force, **over)
    print(
        json.dumps(
            {
                "out": a.out,
                "params": info["params"],
                "shards": info["shards"],
                "seconds": round(time.perf_counter() - t0, 2),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
