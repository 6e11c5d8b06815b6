"""Fisher merging (docs/methods.md, "Fisher merging"; Matena & Raffel, "Merging Models with Fisher-Weighted Averaging").

    τ_merged = λ · ((Σ_t F_t · τ_t) / (Σ_t F_t)),   and λ · mean_t τ_t where Σ_t F_t = 0,

element-wise, in the compute dtype (float32; float64 when an input is float64), sums from zero in
agent order. F_t is agent t's diagonal Fisher information, one float tensor per agent tensor, stored
as safetensors under the agent's tensor names (``ram-merge fisher``, ``ram_desktop.evaluate.fisher``).
The Fisher files are per-agent auxiliary inputs (``Streaming.aux_inputs``): the engine checks their
names and shapes against the plan and the reader streams them slice by slice beside the agents, so
memory stays bounded by the chunk.

``--fisher-suite`` names each agent's calibration suite instead of ``--fisher``: the faces (command line,
window) compute or reuse the cached Fisher files first (``evaluate.fisher.resolve_fisher_params``),
since the core runs no model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..engine.chunks import Chunk
from ..errors import InputError
from ..lazy import torch
from ..storage.formats import Checkpoint
from .base import Interop, MergeMethod, Param, Streaming

KEY_PREFIX = "fisher:"
SINGLE_FILE = "fisher.safetensors"
INDEX_FILE = "fisher.safetensors.index.json"

SCALE = Param(
    "scale", float, 1.0, "scaling λ of the Fisher-weighted average of task vectors", 0.0, 10.0, paper_range="0.1-1.0"
)
EXAMPLES = Param(
    "examples",
    int,
    256,
    "calibration examples per agent for the Fisher estimate (with --fisher-suite)",
    1,
    1_000_000,
    paper_range="256-2048",
)
FISHER = Param("fisher", str, None, "Fisher folder of each agent (written by ram-merge fisher)", per_agent=True)
SUITE = Param(
    "suite",
    str,
    None,
    "calibration suite of each agent (its Fisher is computed and cached first)",
    per_agent=True,
    flag_name="fisher_suite",
)


NEEDS_FISHER = (
    "fisher merging needs each agent's Fisher information: pass --fisher-suite SUITE,... (one calibration "
    "suite per agent, in agent order) or --fisher DIR,... (folders written by ram-merge fisher)"
)


def aux_key(fisher: list[str]) -> str:
    return KEY_PREFIX + "\0".join(fisher)


def open_fisher(folder: str | Path) -> Checkpoint:
    """A Fisher folder (``fisher.safetensors``, or its shards + ``fisher.safetensors.index.json``) or one
    ``.safetensors`` file, opened as a checkpoint: headers read and checked, no tensor data."""
    from ..storage.formats.base import check_index_covers, index_shards
    from ..storage.formats.safetensors_format import open_file, read_header

    path = Path(folder).expanduser()
    if not path.exists():
        raise InputError(
            f"Fisher folder {path} does not exist; write one with ram-merge fisher AGENT --suite SUITE --out DIR"
        )
    path = path.resolve()
    if path.is_file():
        return open_file(path, str(folder))
    if (path / INDEX_FILE).is_file():
        files = index_shards(path / INDEX_FILE)
        tensors = {}
        for f in files:
            tensors.update(read_header(f)[0])
        check_index_covers(path / INDEX_FILE, tensors)
        return Checkpoint(str(folder), path, files, tensors)
    if (path / SINGLE_FILE).is_file():
        ckpt = open_file(path / SINGLE_FILE, str(folder))
        return Checkpoint(str(folder), path, ckpt.files, ckpt.tensors)
    raise InputError(f"Fisher folder {path} holds no {SINGLE_FILE} or {INDEX_FILE}; write it with ram-merge fisher")


def fisher_aux_inputs(params: dict) -> dict[str, list[Checkpoint]]:
    fisher = params.get("fisher")
    if fisher:
        return {aux_key(fisher): [open_fisher(f) for f in fisher]}
    if params.get("suite"):
        raise InputError(
            "fisher merging with --fisher-suite needs the agents' Fisher files computed first: run it with "
            "ram-merge merge/run or the window (they compute and cache them), or pass --fisher DIR,... "
            "from ram-merge fisher"
        )
    raise InputError(NEEDS_FISHER)


def fisher_prepare(params: dict, probe: Any, collected: Any) -> dict:
    fisher = params.get("fisher") or []
    return {"key": aux_key(fisher), "scale": params["scale"], "sources": fisher}


def fisher_merge(chunk: Chunk, ctx: dict) -> torch.Tensor:
    """docs/methods.md ("Fisher merging"), exactly: numerator, denominator and the fallback sum run from zero
    in agent order."""
    fishers = chunk.aux[ctx["key"]]
    like = chunk.base
    n = chunk.n_agents
    weighted = torch.zeros_like(like)
    total_f = torch.zeros_like(like)
    total_tau = torch.zeros_like(like)
    for t in range(n):
        f = _widened(fishers[t], like)
        if not bool(torch.isfinite(f).all()) or bool((f < 0).any()):
            raise InputError(
                f"Fisher file {ctx['sources'][t]} has a negative, NaN or infinite value in tensor "
                f"{chunk.name!r} (agent {t + 1}); a Fisher information is finite and >= 0 — compute it "
                f"again with ram-merge fisher"
            )
        weighted += f * chunk.taus[t]
        total_f += f
        total_tau += chunk.taus[t]
    mean = total_tau / torch.tensor(float(n), dtype=like.dtype, device=like.device)
    merged = torch.where(total_f > 0, weighted / total_f, mean)
    return merged * torch.tensor(ctx["scale"], dtype=like.dtype, device=like.device)


def _widened(f: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The Fisher slice in the compute dtype; rows an agent lacks (``--vocab common``) get F = 0."""
    out = torch.zeros_like(like)
    out[: f.numel()] = f
    return out


METHODS = (
    MergeMethod(
        "fisher",
        "Fisher",
        "Fisher-weighted average λ·ΣF_t·τ_t/ΣF_t (diagonal Fisher per agent on its calibration suite; "
        "mean where ΣF = 0).",
        (SCALE, EXAMPLES, FISHER, SUITE),
        merge=fisher_merge,
        prepare=fisher_prepare,
        streaming=Streaming(aux_inputs=fisher_aux_inputs, thread_safe=True),
        interop=Interop(
            calibration=(SUITE.name, EXAMPLES.name, FISHER.name),
            citation="Matena & Raffel, *Merging Models with Fisher-Weighted Averaging*, NeurIPS 2022, arXiv 2111.09832",
        ),
    ),
)
