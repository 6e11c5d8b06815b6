"""Streaming reads: split each tensor into row slices of bounded size and read them with ``get_slice``.

Reading runs in a background thread (``prefetch_chunks``) so the next slice is read (and, on a GPU,
copied to the device through ``transfer.Transfer``) while this one is computed. Per-chunk temporaries live in a
``Workspace`` that is reused from chunk to chunk, so a pass allocates no new large buffers after
its first chunk and its memory is bounded by the chunk size.
"""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

import numpy as np

from ..errors import InputError
from ..events import CancelToken
from ..lazy import torch
from ..storage.formats import lora, open_slices
from ..storage.formats.base import FLOAT_OF_BITS, BitsHandle, torch_dtype
from ..storage.transfer import Staged, Transfer
from .plan import AuxInput, MergePlan, TensorJob

if TYPE_CHECKING:
    from typing_extensions import Self

DEFAULT_CHUNK_ELEMENTS = 1 << 19  # 512 Ki elements per input slice: ~2 MiB per float32 copy, cache-sized
PATTERN_MAX_AGENTS = 16  # up to this many agents, the update pattern Σ m_t·2^t fits a small lookup table
PREFETCH_DEPTH = 3  # chunks read ahead of the one being computed


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
    return [
        Span(s, min(s + rows, job.shape[0]), s * row, (min(s + rows, job.shape[0]) - s) * row)
        for s in range(0, job.shape[0], rows)
    ]


class Workspace:
    """Named scratch buffers reused across chunks (grown when a larger chunk arrives).

    A tensor obtained from a workspace is valid until the same name is requested again, i.e. until
    the next chunk: never keep it past the chunk it was computed for.
    """

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        numel = math.prod(shape)
        buf = self._buffers.get(name)
        if buf is None or buf.numel() < numel or buf.dtype != dtype or buf.device != device:
            buf = torch.empty(max(numel, 1), dtype=dtype, device=device)
            self._buffers[name] = buf
        return buf[:numel].view(shape)


_thread = threading.local()


def thread_workspace() -> Workspace:
    """This thread's ``Workspace``: scratch buffers reused from chunk to chunk and tensor to tensor (a new
    buffer per tensor would page-fault its size again)."""
    ws = getattr(_thread, "workspace", None)
    if ws is None:
        ws = _thread.workspace = Workspace()
    return ws


@dataclass
class Chunk:
    """A slice of one tensor: the base, and the agents' task vectors τ_t = θ_t − θ_pre (compute dtype).

    ``masks`` (|τ| > ε), ``counts`` (c_i) and ``pattern`` (Σ_t m_t,i·2^t) are computed once and
    shared by the probe and the method. With a ``workspace`` they live in reused buffers and are
    valid only while this chunk is being processed.
    """

    job_index: int
    name: str
    offset: int
    base: torch.Tensor  # [n]
    taus: torch.Tensor  # [N, n]
    eps: float
    _masks: torch.Tensor | None = field(default=None, repr=False)
    _counts: torch.Tensor | None = field(default=None, repr=False)
    workspace: Workspace | None = field(default=None, repr=False)
    _abs: torch.Tensor | None = field(default=None, repr=False)
    _pattern: torch.Tensor | None = field(default=None, repr=False)
    _mask_values: torch.Tensor | None = field(default=None, repr=False)
    _masked_sum: torch.Tensor | None = field(default=None, repr=False)
    # per-agent auxiliary slices (``Streaming.aux_inputs``): key -> one raw slice per agent, as stored
    aux: dict[str, list[torch.Tensor]] = field(default_factory=dict, repr=False)
    # the slices as stored (base, then agents), for methods that combine weights rather than task vectors
    raw: list[torch.Tensor] | None = field(default=None, repr=False)
    delta_agents: tuple[bool, ...] = field(default=(), repr=False)  # agents whose stored slice is already τ (LoRA)
    # ``raw`` already widened to float32 (base, then agents), for ``thetas(float32)`` without a new copy
    widened: list[torch.Tensor] | None = field(default=None, repr=False)
    # the run's cancel token, for a method whose one chunk takes long (WUDI's optimisation): checked as it goes
    cancel: CancelToken | None = field(default=None, repr=False)

    @property
    def n_agents(self) -> int:
        return self.taus.shape[0]

    def scratch(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A scratch buffer for this chunk's computations (reused from chunk to chunk with a workspace):
        valid until the same name is asked for again, so never keep it past this chunk."""
        if self.workspace is None:
            return torch.empty(shape, dtype=dtype, device=self.taus.device)
        return self.workspace.get(name, shape, dtype, self.taus.device)

    @property
    def abs_taus(self) -> torch.Tensor:
        """|τ| (computed once)."""
        if self._abs is None:
            self._abs = torch.abs(self.taus, out=self.scratch("abs", tuple(self.taus.shape), self.taus.dtype))
        return self._abs

    @property
    def mask_values(self) -> torch.Tensor:
        """The masks [|τ| > ε] as 0.0 / 1.0 in the compute dtype (computed once).

        Comparing into a float output and multiplying float by float are vectorised on CPU, unlike a
        bool output or a float × bool product (measured: 0.3 vs 1.3 ns and 0.6 vs 2.6 ns per element
        for three agents); the comparison is the same (ε in the compute dtype), so every use gives
        the same bits as the bool masks.
        """
        if self._mask_values is None:
            out = self.scratch("mask_values", tuple(self.taus.shape), self.taus.dtype)
            if self._abs is not None:
                torch.gt(self._abs, self.eps, out=out)
            else:  # |τ| straight into the output buffer, compared in place
                torch.abs(self.taus, out=out).gt_(self.eps)
            self._mask_values = out
        return self._mask_values

    @property
    def masks(self) -> torch.Tensor:
        if self._masks is None:
            out = self.scratch("masks", tuple(self.taus.shape), torch.bool)
            self._masks = out.copy_(self.mask_values)  # 1.0 -> True, 0.0 -> False
        return self._masks

    @property
    def counts(self) -> torch.Tensor:
        if self._counts is None:
            self._counts = torch.sum(
                self.masks, 0, dtype=torch.int32, out=self.scratch("counts", (self.taus.shape[1],), torch.int32)
            )
        return self._counts

    @property
    def pattern(self) -> torch.Tensor:
        """int32 per element: bit t set where agent t updates it (at most ``PATTERN_MAX_AGENTS`` agents)."""
        if self._pattern is None:
            if self.n_agents > PATTERN_MAX_AGENTS:
                raise ValueError(f"update patterns need at most {PATTERN_MAX_AGENTS} agents")
            # Σ_t m_t·2^t summed in the compute dtype (exact: integers below 2^16) and converted once
            m = self.mask_values
            p = self.scratch("pattern", (self.taus.shape[1],), torch.int32)
            if self.n_agents == 1:
                p.copy_(m[0])
            else:
                acc = torch.add(m[0], m[1], alpha=2, out=self.scratch("pattern_acc", (self.taus.shape[1],), m.dtype))
                for t in range(2, self.n_agents):
                    acc.add_(m[t], alpha=1 << t)
                p.copy_(acc)
            self._pattern = p
        return self._pattern

    @property
    def masked_sum(self) -> torch.Tensor:
        """Σ_t [m_t]·τ_t, agents in order 0..N−1 (computed once; read-only for its users). Where exactly
        one agent t updates an element it is τ_t, where none does it is +0.

        [m_t]·τ_t is a multiply by the 0/1 mask values (several times faster than torch.where on CPU).
        It gives −0 instead of +0 where a negative τ is masked out; adding +0 at the end restores the
        reference's bits: a sum of ±0 and nonzero terms differs from the +0-based sum only by the sign
        of an all-zero result (only possible where no agent updates), and x + (+0) = x for every other
        x. The products are fused into the sums with addcmul: a product by 0.0 or 1.0 is exact, so a
        fused multiply-add rounds exactly like the separate operations.
        """
        if self._masked_sum is None:
            m = self.mask_values
            total = torch.mul(
                self.taus[0], m[0], out=self.scratch("masked_sum", (self.taus.shape[1],), self.taus.dtype)
            )
            for t in range(1, self.n_agents):
                total.addcmul_(self.taus[t], m[t])
            self._masked_sum = total.add_(0.0)
        return self._masked_sum

    def thetas(self, dtype: torch.dtype) -> list[torch.Tensor]:
        """The weights as stored, base first and then each agent, converted to ``dtype`` (a value-exact
        widening, or the one rounding of a narrowing, like ``Tensor.to``). A LoRA agent, whose slice is its
        task vector, becomes base + τ in the compute dtype; an agent with fewer vocabulary rows than the base
        takes the base's values in the rest."""
        if self.raw is None:
            return [self.base.to(dtype)] + [(self.base + tau).to(dtype) for tau in self.taus]
        if self.widened is not None and dtype == torch.float32:
            return list(self.widened)
        base = self.raw[0].reshape(-1).to(dtype)
        out = [base]
        for t, raw in enumerate(self.raw[1:]):
            flat = raw.reshape(-1)
            if t < len(self.delta_agents) and self.delta_agents[t]:
                out.append((self.base + self.taus[t]).to(dtype))
            elif flat.numel() == base.numel():
                out.append(flat.to(dtype))
            else:
                full = base.clone()
                full[: flat.numel()] = flat.to(dtype)
                out.append(full)
        return out

    def all_finite(self) -> bool:
        """True when no task vector entry is NaN or ±Inf (one reduction over τ). A sum of finite values
        may overflow to ±Inf: that only sends the caller to its slower per-agent check."""
        if self.taus.numel() == 0:
            return True
        if self._abs is not None:
            return bool(torch.isfinite(self._abs.max()))
        return bool(torch.isfinite(self.taus.sum()))


class _RowSlices(Protocol):
    def __getitem__(self, rows: slice) -> torch.Tensor: ...


class SliceHandle(Protocol):
    """An open weights file as ``open_slices`` gives it: ``get_slice(name)[a:b]`` (rows a..b) and ``get_tensor(name)``."""

    def get_slice(self, name: str) -> _RowSlices: ...

    def get_tensor(self, name: str) -> torch.Tensor: ...


class OpenFiles:
    """Input files opened once (``open_slices``) and kept open until closed. A run that makes several passes
    keeps one for all of them, so a later pass reads through the same memory mappings and does not
    page-fault the inputs in again (~0.4 CPU-s per pass over 2.4 GB here)."""

    def __init__(self) -> None:
        self._stack = ExitStack()
        self._handles: dict[Path, SliceHandle] = {}
        self._lock = threading.Lock()

    def get(self, file: Path) -> SliceHandle:
        with self._lock:
            handle = self._handles.get(file)
            if handle is None:
                handle = self._handles[file] = self._stack.enter_context(open_slices(file))
            return handle

    def close(self) -> None:
        with self._lock:
            self._handles.clear()
            self._stack.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SliceReader:
    """Reads row slices as stored (no dtype change) from ``files`` (its own, closed at exit, when none is given).

    With ``bits``, safetensors slices come as flat numpy views of their stored bits (what the fused
    kernels read; ``as_tensor`` turns a float one into a tensor without a copy); other formats, and
    every slice without ``bits``, as torch tensors."""

    def __init__(self, bits: bool = False, files: OpenFiles | None = None) -> None:
        self._own = files is None
        self._files = OpenFiles() if files is None else files
        self._bits = bits

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._own:
            self._files.close()

    def read(self, file: Path, name: str, span: Span, shape: tuple[int, ...]) -> torch.Tensor | np.ndarray:
        handle = self._files.get(file)
        if self._bits and isinstance(handle, BitsHandle):
            return handle.bits(name, span.start, span.stop) if shape else handle.bits(name, 0, 1)
        if len(shape) == 0:
            return handle.get_tensor(name).reshape(1)
        return handle.get_slice(name)[span.start : span.stop].reshape(-1)


def _read_chunks(
    plan: MergePlan, jobs: list[int], reader: SliceReader, chunk_elements: int, aux: Sequence[AuxInput]
) -> Iterator[tuple[int, Span, torch.Tensor | np.ndarray, list[torch.Tensor | np.ndarray]]]:
    for index in jobs:
        job = plan.jobs[index]
        for span in spans(job, chunk_elements):
            # each source is read under its own tensor name (a tied lm_head is read from the embedding)
            base = reader.read(job.base.file, job.base.name, span, job.shape)
            agents = [reader.read(a.file, a.name, span, job.shape) for a in job.agents] if job.mergeable else []
            if job.mergeable:  # auxiliary per-agent inputs follow the agents, in ``aux`` order
                agents += [reader.read(a.file, a.name, span, a.shape) for x in aux for a in x.tensors[index]]
            yield index, span, base, agents


class _Stop(Exception):
    pass


_Item = TypeVar("_Item")


def _background(produce: Callable[[Callable[[_Item], None]], None], depth: int) -> Iterator[_Item]:
    """Run ``produce(put)`` in a thread and yield what it puts, in order, at most ``depth`` ahead.

    An exception in the producer is re-raised in the consumer; when the consumer stops early
    (cancel, error), the producer is told to stop and joined.
    """
    items: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def put(item: object) -> None:
        while not stop.is_set():
            try:
                items.put(item, timeout=0.1)
                return
            except queue.Full:
                continue
        raise _Stop

    def run() -> None:
        try:
            produce(put)
            put((done, None))
        except _Stop:
            pass
        except BaseException as e:  # noqa: BLE001  handed to the consumer, which raises it in its thread
            try:
                put((done, e))
            except _Stop:
                pass

    thread = threading.Thread(target=run, name="ram-desktop-reader", daemon=True)
    thread.start()
    try:
        while True:
            item = items.get()
            if isinstance(item, tuple) and len(item) == 2 and item[0] is done:
                if item[1] is not None:
                    raise item[1]
                return
            yield item
    finally:
        stop.set()
        thread.join()


def prefetch_chunks(
    plan: MergePlan,
    jobs: list[int],
    chunk_elements: int,
    transfer: Transfer,
    depth: int = PREFETCH_DEPTH,
    bits: bool = False,
    files: OpenFiles | None = None,
    aux: Sequence[AuxInput] = (),
) -> Iterator[tuple[int, Span, torch.Tensor | np.ndarray, list[torch.Tensor | np.ndarray]]]:
    """Yield ``(job_index, span, base_raw, agent_raws)`` slices in stored dtype, on the transfer's device,
    in order, read and copied ahead in a background thread (``transfer.send`` there,
    ``transfer.receive`` here). ``bits``: safetensors slices as numpy bit views (``SliceReader``), for a
    CPU pass on the fused kernels; ``files``: the run's open inputs (else the pass opens its own).
    ``aux``: per-agent auxiliary inputs read beside the agents: for a mergeable job their slices follow
    the agents' in ``agent_raws`` (``StoredSlices.read`` splits them off)."""

    def produce(put: Callable[[tuple[int, Span, Staged]], None]) -> None:
        with SliceReader(bits, files) as reader:
            for index, span, base, agents in _read_chunks(plan, jobs, reader, chunk_elements, aux):
                put((index, span, transfer.send([base, *agents])))

    for index, span, staged in _background(produce, depth):
        tensors = transfer.receive(staged)
        yield index, span, tensors[0], tensors[1:]


def as_tensor(raw: torch.Tensor | np.ndarray) -> torch.Tensor:
    """A float slice as a tensor: numpy stored bits (``SliceReader`` with ``bits``; bfloat16 as uint16,
    float16 as int16) become a tensor view of the same memory, tensors stay as they are."""
    if isinstance(raw, np.ndarray):
        return torch.from_numpy(raw).view(torch_dtype(FLOAT_OF_BITS[raw.dtype]))
    return raw


def make_chunk(
    job_index: int,
    job: TensorJob,
    span: Span,
    base_stored: torch.Tensor | np.ndarray,
    agents_stored: Sequence[torch.Tensor | np.ndarray],
    eps: float,
    workspace: Workspace | None = None,
) -> Chunk:
    """Widen a slice to the compute dtype and form the task vectors (τ_t = agent − base, computed in
    the compute dtype: the mixed-dtype subtraction widens the stored agent value exactly first)."""
    base_raw, agent_raws = as_tensor(base_stored), [as_tensor(a) for a in agents_stored]
    n = base_raw.numel()
    device = base_raw.device
    if workspace is None:
        base = base_raw.to(job.compute_dtype)
        taus = torch.empty((len(agent_raws), n), dtype=job.compute_dtype, device=device)
    else:
        base = workspace.get("base", (n,), job.compute_dtype, device)
        base.copy_(base_raw)
        taus = workspace.get("taus", (len(agent_raws), n), job.compute_dtype, device)
    for t, raw in enumerate(agent_raws):
        m = raw.numel()
        if lora.is_delta_file(job.agents[t].file):  # a LoRA agent's slice is already its task vector
            taus[t].copy_(raw)
        elif m == n and workspace is not None and raw.dtype != taus.dtype:
            # widen into the reused buffer, then subtract in place: the same float arithmetic as the
            # mixed-dtype subtraction, without the temporary it allocates (and page-faults) per call
            taus[t].copy_(raw)
            taus[t].sub_(base)
        elif m == n:
            torch.sub(raw, base, out=taus[t])
        else:  # an agent with fewer vocabulary rows than the base (plan vocab="common"): the rest is unchanged
            torch.sub(raw, base[:m], out=taus[t, :m])
            taus[t, m:] = 0
    return Chunk(
        job_index,
        job.name,
        span.offset,
        base,
        taus,
        eps,
        workspace=workspace,
        raw=[base_raw, *agent_raws],
        delta_agents=tuple(lora.is_delta_file(a.file) for a in job.agents),
    )


def load_chunk(
    plan: MergePlan,
    job_index: int,
    span: Span,
    base_raw: torch.Tensor | np.ndarray,
    agent_raws: Sequence[torch.Tensor | np.ndarray],
    eps: float,
    workspace: Workspace | None = None,
    aux: dict[str, list] | None = None,
) -> Chunk:
    """``make_chunk`` plus the checks every chunk must pass, in every pass (a merge that reuses a cached
    probe included): no base or task-vector entry is NaN or ±Inf. ``aux``: the auxiliary inputs' slices
    (key -> one raw slice per agent), handed to the chunk as ``chunk.aux``."""
    chunk = make_chunk(job_index, plan.jobs[job_index], span, base_raw, agent_raws, eps, workspace)
    for key, raws in (aux or {}).items():
        chunk.aux[key] = [as_tensor(a) for a in raws]
    if not chunk.all_finite():
        if not bool(torch.isfinite(chunk.base).all()):  # then every agent's τ is NaN there: blame the base
            raise InputError(
                f"tensor {chunk.name!r} of the base ({plan.base.display}) has NaN or Inf; "
                "the checkpoint is broken — re-export it"
            )
        for t in range(chunk.n_agents):
            if not bool(torch.isfinite(chunk.taus[t]).all()):
                raise InputError(
                    f"tensor {chunk.name!r} of agent {plan.names[t]!r} ({plan.agents[t].display}) "
                    "has NaN or Inf in its task vector; the checkpoint is broken — re-export it"
                )
    return chunk


@dataclass(frozen=True)
class StoredSlices:
    """One chunk as read, before τ is formed: what a pass's per-chunk work and a fused kernel need.
    ``agents``: the agents' raw slices in agent order (numpy bits or tensors, as the reader gave them);
    ``aux``: the auxiliary inputs' slices, key -> one per agent."""

    plan: MergePlan
    index: int
    span: Span
    base: torch.Tensor | np.ndarray
    agents: list
    eps: float
    aux: dict[str, list] = field(default_factory=dict)

    @classmethod
    def read(cls, plan: MergePlan, item: tuple, eps: float, aux: Sequence[AuxInput] = ()) -> StoredSlices:
        """From one ``prefetch_chunks`` item read with the same ``aux``: the agents' slices and, after them,
        each auxiliary input's (one per agent, in ``aux`` order) apart."""
        index, span, base, raws = item
        if not aux or not plan.jobs[index].mergeable:
            return cls(plan, index, span, base, raws, eps)
        n = plan.n_agents
        extra = {x.key: raws[n + k * n : n + (k + 1) * n] for k, x in enumerate(aux)}
        return cls(plan, index, span, base, raws[:n], eps, extra)

    @property
    def job(self) -> TensorJob:
        return self.plan.jobs[self.index]

    def load(self, workspace: Workspace | None = None) -> Chunk:
        """The chunk (``load_chunk``): τ formed and checked; raises naming agent and tensor for NaN or Inf."""
        return load_chunk(self.plan, self.index, self.span, self.base, self.agents, self.eps, workspace, self.aux)
