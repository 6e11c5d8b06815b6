"""Align a base and its agents into tensor jobs, with every check that needs no tensor data."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field

import torch

from .errors import InputError
from .safetensors_io import TensorInfo
from .sources import Checkpoint

log = logging.getLogger("ram_desktop")

OUT_DTYPES: dict[str, torch.dtype | None] = {
    "base": None,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
}
MAX_LISTED = 5


@dataclass(frozen=True)
class TensorJob:
    """One output tensor: where its base and agent slices come from and what it becomes."""

    name: str
    shape: tuple[int, ...]
    base: TensorInfo
    agents: tuple[TensorInfo, ...]
    out_dtype: torch.dtype
    compute_dtype: torch.dtype
    mergeable: bool  # floating point: merged; otherwise copied from the base

    @property
    def numel(self) -> int:
        return self.base.numel

    @property
    def out_bytes(self) -> int:
        return self.numel * self.out_dtype.itemsize


@dataclass
class MergePlan:
    base: Checkpoint
    agents: list[Checkpoint]
    names: list[str]
    jobs: list[TensorJob]
    out_dtype: str
    warnings: list[str] = field(default_factory=list)

    @property
    def n_agents(self) -> int:
        return len(self.agents)

    @property
    def mergeable_jobs(self) -> list[TensorJob]:
        return [j for j in self.jobs if j.mergeable]

    @property
    def params(self) -> int:
        """Elements compared between base and agents (the floating-point tensors)."""
        return sum(j.numel for j in self.jobs if j.mergeable)

    @property
    def out_bytes(self) -> int:
        return sum(j.out_bytes for j in self.jobs)

    @property
    def input_bytes(self) -> int:
        return sum(c.size_bytes for c in [self.base, *self.agents])

    def fingerprint(self) -> str:
        """Identifies the inputs (files, sizes, modification times, tensor set) for the probe cache."""
        h = hashlib.sha256()
        for ckpt in [self.base, *self.agents]:
            h.update(b"\0ckpt")
            for f in ckpt.files:
                st = f.stat()
                h.update(f"{f}|{st.st_size}|{st.st_mtime_ns}\n".encode())
            if ckpt.revision:
                h.update(ckpt.revision.encode())
        for job in self.mergeable_jobs:
            h.update(f"{job.name}{job.shape}".encode())
        return h.hexdigest()[:32]


def default_names(agents: list[Checkpoint]) -> list[str]:
    """Agent names from their folder, file or repository names, made unique."""
    names: list[str] = []
    for ckpt in agents:
        stem = ckpt.repo_id.split("/")[-1] if ckpt.repo_id else (ckpt.path.name if ckpt.path.is_dir() else ckpt.path.stem)
        name, k = stem, 2
        while name in names:
            name, k = f"{stem}-{k}", k + 1
        names.append(name)
    return names


def make_plan(base: Checkpoint, agents: list[Checkpoint], names: list[str] | None = None,
              out_dtype: str = "base") -> MergePlan:
    """Check that base and agents line up and list the tensor jobs; raise one clear ``InputError`` if not."""
    if not agents:
        raise InputError("no agents given; name at least one agent checkpoint to merge into the base")
    if out_dtype not in OUT_DTYPES:
        raise InputError(f"unknown output dtype {out_dtype!r}; choose one of {', '.join(OUT_DTYPES)}")
    if names is None:
        names = default_names(agents)
    names = [n.strip() for n in names]
    if len(names) != len(agents):
        raise InputError(f"{len(names)} names given for {len(agents)} agents; give one name per agent")
    if len(set(names)) != len(names) or not all(names):
        raise InputError(f"agent names must be unique and non-empty: {', '.join(names)}")

    _check_tensor_sets(base, agents)
    warnings: list[str] = []
    jobs: list[TensorJob] = []
    mixed: set[str] = set()
    for name, b in base.tensors.items():
        infos = tuple(a.tensors[name] for a in agents)
        for ckpt, info in zip(agents, infos):
            if info.shape != b.shape:
                raise InputError(
                    f"tensor {name!r} has shape {list(info.shape)} in {ckpt.display} but {list(b.shape)} in "
                    f"the base {base.display}; these models do not share an architecture"
                )
            if info.is_float != b.is_float:
                raise InputError(f"tensor {name!r} is {info.dtype} in {ckpt.display} but {b.dtype} in the base")
            if info.dtype != b.dtype:
                mixed.add(ckpt.display)
        all_dtypes = [b.torch_dtype, *(i.torch_dtype for i in infos)]
        compute = torch.float64 if torch.float64 in all_dtypes else torch.float32
        chosen = OUT_DTYPES[out_dtype]
        out = chosen if (b.is_float and chosen is not None) else b.torch_dtype
        jobs.append(TensorJob(name, b.shape, b, infos, out, compute, b.is_float))

    if len(agents) == 1:
        warnings.append("only one agent: merging it with the base reproduces (RAM) or rescales (RAM+) that agent")
    seen: dict[tuple, str] = {}
    for ckpt, name in zip(agents, names):
        key = tuple(sorted(map(str, ckpt.files)))
        if key in seen:
            warnings.append(f"agent {name!r} is the same checkpoint as agent {seen[key]!r}")
        seen.setdefault(key, name)
        if key == tuple(sorted(map(str, base.files))):
            warnings.append(f"agent {name!r} is the base checkpoint itself")
    for display in sorted(mixed):
        warnings.append(f"{display} stores some tensors in another dtype than the base; computing in float32")
    for w in warnings:
        log.warning(w)
    return MergePlan(base, agents, names, jobs, out_dtype, warnings)


def _check_tensor_sets(base: Checkpoint, agents: list[Checkpoint]) -> None:
    expected = set(base.tensors)
    problems = []
    for ckpt in agents:
        have = set(ckpt.tensors)
        missing, extra = sorted(expected - have), sorted(have - expected)
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"missing {_listing(missing)}")
            if extra:
                parts.append(f"extra {_listing(extra)}")
            problems.append(f"{ckpt.display}: {'; '.join(parts)}")
    if problems:
        raise InputError(
            "tensor names differ from the base " + base.display + " — " + " | ".join(problems)
            + "; agents must be fine-tuned from this base with the same architecture"
        )


def _listing(names: list[str]) -> str:
    shown = ", ".join(names[:MAX_LISTED])
    return f"{len(names)} ({shown}{', ...' if len(names) > MAX_LISTED else ''})"
