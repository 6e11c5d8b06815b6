"""What the passes need of a merge method, as types the engine owns: a method (``core.methods``) fills them
in, the engine reads them and never imports the methods.

``Streaming`` says how the merge pass feeds a method (chunk shape, threads, θ or τ, its fused kernel, extra
inputs); ``Collector`` / ``SliceCollector`` gather whole-model statistics in pass 1; ``Observer`` /
``SliceObserver`` watch every merged chunk; ``FusedKernel`` is a method's fused CPU merge of one chunk from its
stored slices.
``MergingMethod`` is the part of a method a ``passes.PassOutput`` holds.
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
