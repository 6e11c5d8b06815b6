"""What the passes need of a merge method, as types the engine owns: a method (``core.methods``) fills them
in, the engine reads them and never imports the methods.

``Streaming`` says how the merge pass feeds a method (chunk shape, threads, θ or τ, its fused kernel, extra
inputs); ``Collector`` / ``SliceCollector`` gather whole-model statistics in pass 1; ``Observer`` /
``SliceObserver`` watch every merged chunk; ``FusedKernel`` is a method's fused CPU merge of one chunk from its
stored slices.
``MergingMethod`` is the part of a method a ``passes.PassOutput`` holds. ``ProbeStatistic`` is a statistic a method
adds to the complete (Analyze) probe, which runs with no method chosen: the pipeline hands the methods' statistics
to the probe, so the engine counts them without knowing whose they are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ..lazy import torch
    from ..storage.formats import Checkpoint
    from .chunks import Chunk, StoredSlices
    from .kernels import KernelResult


class Collector(Protocol):
    """Whole-model statistics a method gathers in pass 1 beyond the probe (e.g. TIES's magnitude cut).

    ``next_pass()`` is called after each full pass over the data; True asks the engine to feed every
    chunk once more before ``finish`` (TIES refines its exact cut this way).

    ``add`` runs on several compute threads at once, chunks in any order: the statistic must be
    order-independent (e.g. integer histograms summed under a lock)."""

    def add(self, chunk: Chunk) -> None: ...

    def next_pass(self) -> bool: ...

    def finish(self) -> Any: ...


@runtime_checkable
class SliceCollector(Collector, Protocol):
    """A collector that can also count a chunk from the stored slices through a fused CPU kernel.

    ``add_slices(slices)`` (a ``chunks.StoredSlices``) adds the same statistic as ``add`` would for that chunk
    and returns True, or returns False having added nothing (the kernels do not cover the slices, or a τ is
    not finite): the pass then forms the chunk and calls ``add``."""

    def add_slices(self, slices: StoredSlices) -> bool: ...


class Observer(Protocol):
    """Watches each merged chunk: ``observe(chunk, context, merged)`` with ``merged`` the output slice as
    written (θ rounded to the output dtype). It may run in several compute threads at once."""

    def observe(self, chunk: Chunk, context: Any, merged: torch.Tensor) -> None: ...

    def finish(self) -> Any: ...


@runtime_checkable
class SliceObserver(Observer, Protocol):
    """An observer that can also take what its method's ``FusedKernel``, asked to ``observe``, counted of a chunk
    while merging it (``KernelResult.observed``): ``observe_slices(slices, observed)`` then stands for
    ``observe``. The engine hands ``observed`` over unread; only the method knows what it holds. A variant whose
    observer is not a ``SliceObserver`` takes the torch path."""

    def observe_slices(self, slices: StoredSlices, observed: Any) -> None: ...


class FusedKernel(Protocol):
    """A method's fused CPU merge of one chunk from its stored slices (built on ``kernels``' primitives), the
    same bits as its ``merge``: ``counts`` asks for the update-pattern histogram too where the kernel counts
    it in the same pass, ``observe`` for what the variant's ``SliceObserver`` takes (``KernelResult.observed``).
    None when the kernels do not cover the slices."""

    def __call__(self, slices: StoredSlices, context: Any, counts: bool, observe: bool, /) -> KernelResult | None: ...


class FusedGroupKernel(Protocol):
    """Several variants of one method family merged from the same stored slices in one pass over them: the work
    they share per element done once, the same bits as each member's ``FusedKernel``. ``members``: each
    variant's ``FusedKernel`` (one of the family's) and context; ``observe``: per member. Results in member
    order, the first carrying the histogram when ``counts`` asks for it; None when the kernels do not cover the
    slices."""

    def __call__(
        self, slices: StoredSlices, members: list[tuple[FusedKernel, Any]], counts: bool, observe: list[bool], /
    ) -> list[KernelResult] | None: ...


@dataclass(frozen=True)
class Streaming:
    """How the merge pass feeds a method.

    ``thread_safe``: ``merge`` depends on nothing but the chunk and the context, so chunks may be merged in
    parallel and in any order. ``whole_tensor``: ``merge`` needs whole-tensor statistics (norms, angles,
    ranks, cosines, a layer's Gram matrix), so the pass hands it each tensor as one chunk (memory bounded by
    one tensor per compute thread, not by the chunk size). ``theta``: ``merge`` returns the merged weights θ
    (any float dtype; the engine rounds them once to the output dtype) instead of τ_merged; it reads the
    stored weights through ``chunk.thetas``. ``fused``: the method's ``FusedKernel`` for CPU passes (None:
    torch only). ``fused_group``: the family's ``FusedGroupKernel``, the same object for every method of the
    family: the variants of a compare whose methods share it run through it together.
    ``aux_inputs(params) -> {key: [Checkpoint per agent]}``: per-agent auxiliary checkpoints
    (Fisher information), opened (headers only), whose tensors carry the agents' names and shapes; the
    engine checks them against the plan and the reader streams their slices beside the agents', so
    ``merge`` finds them as ``chunk.aux[key]`` (one raw slice per agent, in agent order). ``stacks``: the
    method copies layers of a stacking layer map (passthrough); every other method merges all models in
    every slice."""

    thread_safe: bool = False
    whole_tensor: bool = False
    theta: bool = False
    fused: FusedKernel | None = None
    fused_group: FusedGroupKernel | None = None
    aux_inputs: Callable[[dict], dict[str, list[Checkpoint]]] | None = None
    stacks: bool = False


class MergingMethod(Protocol):
    """What a merge pass reads of a method: its name (for errors), ``merge(chunk, context)`` and how it is
    fed (``Streaming``). ``core.methods.MergeMethod`` is one."""

    @property
    def name(self) -> str: ...

    @property
    def merge(self) -> Callable[[Chunk, Any], torch.Tensor]: ...

    @property
    def streaming(self) -> Streaming: ...


@dataclass(frozen=True)
class ProbeStatistic:
    """A statistic of each agent's unique elements (the elements that agent alone updates) that a method adds to the
    complete (Analyze) probe, counted in the probe's one pass over the data and kept in its report and cache.

    The probe gathers every agent's unique elements of a chunk (base value x and update τ, in the compute dtype)
    and hands them over; the statistic counts them into int64 counts of shape ``[N, *shape]`` (agent first), which
    the probe sums over the chunks in any order (so the counts must not depend on chunk boundaries).

    ``name``: its key in ``ProbeReport.statistics``. ``count(x, tau, first, n)``: the torch piece, counts of the
    elements ``x``, ``tau`` (1-D tensors, one device) of agents ``first`` (an int, or one int64 per element), as
    a ``[n, *shape]`` int64 CPU tensor. ``fused(compute)``: the numba piece for the fused CPU path, given the
    compute dtype as a numpy type: a value whose numba type selects the method's overload of
    ``kernel_code.unique_statistic`` (its constants in a named tuple of its own; None: that slice takes the torch
    path), or ``fused`` None for the torch path only. Both pieces must count the same bits. ``finish(counts)``: the value kept in the report from the summed
    ``[N, *shape]`` counts, or from None when the probe did not count it (the merge's pass 1). ``save(value,
    counted)``: the top-level keys it adds to the probe's JSON (its file format); ``load(data)``: (value, counted)
    from that JSON (KeyError or ValueError when the JSON lacks it: the cached probe is computed again).
    ``merge_fields(value, lambdas, out_dtypes)``: what a merge report states from it for the merge's per-agent
    scales and output dtypes, as top-level keys; what a method's observer counted exactly in the merge pass, stated
    under the same key (``methods.base.Analysis.observed_as``), replaces it."""

    name: str
    shape: tuple[int, ...]
    count: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | int, int], torch.Tensor]
    fused: Callable[[type], Any] | None
    finish: Callable[[torch.Tensor | None], Any]
    save: Callable[[Any, bool], dict[str, Any]]
    load: Callable[[dict], tuple[Any, bool]]
    merge_fields: Callable[[Any, list[float], set[str]], dict[str, Any]]
