"""Streaming reads: split each tensor into row slices of bounded size and read them with ``get_slice``."""

from __future__ import annotations

import math
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import torch
from safetensors import safe_open

from .plan import MergePlan, TensorJob

DEFAULT_CHUNK_ELEMENTS = 1 << 22  # 4 Mi elements per input slice: ~16 MiB per float32 copy


@dataclass(frozen=True)
class Span:
    """Rows ``start:stop`` along dim 0 of a tensor, i.e. flat elements ``offset : offset + numel``."""

    start: int
    stop: int
    offset: int
    numel: int


def spans(job: TensorJob, chunk_elements: int) -> list[Span]:
    """Cut a tensor into whole-row slices of at most ``chunk_elements`` elements (at least one row)."""
    if len(job.shape) == 0:
        return [Span(0, 1, 0, 1)]
    row = math.prod(job.shape[1:])
    if row == 0 or job.shape[0] == 0:
        return [Span(0, job.shape[0], 0, 0)]
    rows = max(1, chunk_elements // row)
    return [Span(s, min(s + rows, job.shape[0]), s * row, (min(s + rows, job.shape[0]) - s) * row)
            for s in range(0, job.shape[0], rows)]


@dataclass
class Chunk:
    """A slice of one tensor: the base, and the agents' task vectors τ_t = θ_t − θ_pre (compute dtype).

    ``masks`` (|τ| > ε) and ``counts`` (c_i) are computed once and shared by the probe and the method.
    """

    job_index: int
    name: str
    offset: int
    base: torch.Tensor  # [n]
    taus: torch.Tensor  # [N, n]
    eps: float
    _masks: torch.Tensor | None = field(default=None, repr=False)
    _counts: torch.Tensor | None = field(default=None, repr=False)

    @property
    def n_agents(self) -> int:
        return self.taus.shape[0]

    @property
    def masks(self) -> torch.Tensor:
        if self._masks is None:
            self._masks = self.taus.abs() > self.eps
        return self._masks

    @property
    def counts(self) -> torch.Tensor:
        if self._counts is None:
            counts = self.masks[0].to(torch.int32)
            for t in range(1, self.n_agents):
                counts = counts + self.masks[t]
            self._counts = counts
        return self._counts


class SliceReader:
    """Keeps every input file open for one pass and reads row slices as stored (no dtype change)."""

    def __init__(self) -> None:
        self._stack = ExitStack()
        self._handles: dict[Path, object] = {}

    def __enter__(self) -> "SliceReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def read(self, file: Path, name: str, span: Span, shape: tuple[int, ...]) -> torch.Tensor:
        handle = self._handles.get(file)
        if handle is None:
            handle = self._stack.enter_context(_open_weights(file))
            self._handles[file] = handle
        if len(shape) == 0:
            return handle.get_tensor(name).reshape(1)
        return handle.get_slice(name)[span.start:span.stop].reshape(-1)


def _open_weights(file: Path):
    """A safetensors file through ``safe_open``; anything else is a PyTorch pickle (``pickle_io.PickleHandle``,
    which keeps the file's memory-mapped state dict for the pass)."""
    if file.suffix == ".safetensors" or file.resolve().suffix == ".safetensors":
        return safe_open(str(file), framework="pt")
    from .pickle_io import PickleHandle

    return PickleHandle(file)


def iter_chunks(plan: MergePlan, jobs: list[int], reader: SliceReader, chunk_elements: int, eps: float,
                device: torch.device) -> Iterator[tuple[int, Span, torch.Tensor, list[torch.Tensor]]]:
    """Yield ``(job_index, span, base_raw, agent_raws)`` slices in stored dtype, on ``device``."""
    for index in jobs:
        job = plan.jobs[index]
        for span in spans(job, chunk_elements):
            # each source is read under its own tensor name (a tied lm_head is read from the embedding)
            base = reader.read(job.base.file, job.base.name, span, job.shape)
            agents = [reader.read(a.file, a.name, span, job.shape) for a in job.agents] if job.mergeable else []
            if device.type != "cpu":
                base = base.to(device, non_blocking=True)
                agents = [a.to(device, non_blocking=True) for a in agents]
            yield index, span, base, agents


def make_chunk(job_index: int, job: TensorJob, span: Span, base_raw: torch.Tensor,
               agent_raws: list[torch.Tensor], eps: float) -> Chunk:
    """Widen a slice to the compute dtype and form the task vectors."""
    base = base_raw.to(job.compute_dtype)
    taus = torch.empty((len(agent_raws), base.numel()), dtype=job.compute_dtype, device=base.device)
    for t, raw in enumerate(agent_raws):
        n = raw.numel()
        if n == base.numel():
            torch.sub(raw.to(job.compute_dtype), base, out=taus[t])
        else:  # an agent with fewer vocabulary rows than the base (plan vocab="common"): the rest is unchanged
            torch.sub(raw.to(job.compute_dtype), base[:n], out=taus[t, :n])
            taus[t, n:] = 0
    return Chunk(job_index, job.name, span.offset, base, taus, eps)
