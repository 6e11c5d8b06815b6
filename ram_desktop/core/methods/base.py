"""The contract every merge method fulfils; the engine reads these typed fields instead of flags.

A method is a value: its parameter schema (the CLI flags and the GUI form are generated from it),
whether it needs the whole-model probe before merging, an optional collector of further pass-1
statistics, whether chunks may be merged in parallel, a ``prepare`` that turns parameters and
statistics into the merge context, and a pure ``merge(chunk, context) -> τ_merged``. ``merge`` returns
a value and never writes into the chunk for another module to read. An optional ``observer`` watches
every merged chunk (RAM+'s exact rounding survival count).

Everything else specific to a method is a field too, so code outside ``methods/`` never branches on a
method's name: its fused CPU kernel, its would-keep estimate, its mergekit mapping, the sweep a
comparison offers and its short chart label.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..errors import InputError
from ..lazy import torch
from .mergekit_map import MergekitMapping

if TYPE_CHECKING:
    from ..engine.chunks import Chunk, StoredSlices
    from ..engine.kernels import KernelResult
    from ..engine.plan import MergePlan
    from ..engine.probe import ProbeReport
    from ..storage.formats import Checkpoint


@dataclass(frozen=True)
class Param:
    """One method parameter: its type, default, allowed range and the help shown as a tooltip."""

    name: str
    kind: type  # float, int, str or bool
    default: Any
    help: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] | None = None
    paper_range: str | None = None
    per_agent: bool = False  # a list with one value per agent, in agent order (CLI: comma-separated)
    # the value may be a mergekit-style setting: a gradient over the layers or filters by tensor name
    # (``settings``); per agent, each entry is one (None: the default)
    setting: bool = False
    # the command-line flag's name where the parameter's own would clash with a global option (multislerp's
    # ``eps`` is ``--norm-eps``: ``--eps`` is the probe's threshold); the recipe key stays ``name``
    flag_name: str | None = None

    @property
    def flag(self) -> str:
        return "--" + (self.flag_name or self.name).replace("_", "-")

    def validate(self, value: Any) -> Any:
        if self.setting:
            return self._validate_setting(value)
        if self.per_agent:
            items = value.split(",") if isinstance(value, str) else value
            if not isinstance(items, (list, tuple)):
                raise InputError(f"{self.flag} takes one value per agent, comma-separated; got {value!r}")
            items = [i.strip() if isinstance(i, str) else i for i in items]
            if not items or any(i == "" or i is None for i in items):
                raise InputError(
                    f"{self.flag} has an empty entry ({value!r}); give one value per agent, in agent order"
                )
            return [self._validate_one(i) for i in items]
        return self._validate_one(value)

    def _validate_setting(self, value: Any) -> Any:
        """A setting (``settings.check_setting``); per agent a list of them (text: comma-separated numbers)."""
        from .settings import check_setting

        if not self.per_agent:
            return check_setting(self.flag, value, self._validate_one)
        if isinstance(value, str) and "," not in value or not isinstance(value, (str, list, tuple)):
            return check_setting(
                self.flag, value.strip() if isinstance(value, str) else value, self._validate_one
            )  # one value (or setting) for every agent
        items = value.split(",") if isinstance(value, str) else value
        items = [i.strip() if isinstance(i, str) else i for i in items]
        if not items or any(i == "" for i in items):
            raise InputError(f"{self.flag} has an empty entry ({value!r}); give one value per agent, in agent order")
        return [
            None if i is None else check_setting(f"{self.flag}[{k}]", i, self._validate_one)
            for k, i in enumerate(items)
        ]

    def _validate_one(self, value: Any) -> Any:
        if self.kind is bool:  # true/false (YAML booleans, or their text from a command line or form)
            text = str(value).strip().lower() if isinstance(value, (bool, str)) else None
            if text not in ("true", "false"):
                raise InputError(f"{self.flag} must be true or false, got {value!r}")
            return text == "true"
        try:
            if self.kind is int and isinstance(value, float) and not value.is_integer():
                raise ValueError
            value = self.kind(value)
        except (TypeError, ValueError, OverflowError):
            raise InputError(f"{self.flag} must be a {self.kind.__name__}, got {value!r}") from None
        if self.kind is float and not math.isfinite(value):
            raise InputError(f"{self.flag} must be a finite number, got {value!r}")
        if self.choices is not None and value not in self.choices:
            raise InputError(f"{self.flag} must be one of {', '.join(self.choices)}, got {value!r}")
        if self.minimum is not None and value < self.minimum:
            raise InputError(f"{self.flag} must be at least {self.minimum}, got {value}")
        if self.maximum is not None and value > self.maximum:
            raise InputError(f"{self.flag} must be at most {self.maximum}, got {value}")
        return value

    def describe(self) -> str:
        """One line for help texts and tooltips: help, default, allowed and paper ranges."""
        parts = [self.help + (" (one per agent, comma-separated, in agent order)" if self.per_agent else "")]
        if self.default is not None:
            parts.append(f"default {self.default}")
        if self.choices:
            parts.append("one of " + "|".join(self.choices))
        elif self.minimum is not None or self.maximum is not None:
            parts.append(
                f"allowed {self.minimum if self.minimum is not None else '-inf'}.."
                f"{self.maximum if self.maximum is not None else 'inf'}"
            )
        if self.paper_range:
            parts.append(f"paper search range {self.paper_range}")
        return "; ".join(parts)


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


class FusedKernel(Protocol):
    """A method's fused CPU merge of one chunk from its stored slices (``kernels.py``), the same bits as
    ``merge``: ``counts`` asks for the update-pattern histogram too where the kernel counts it in the same
    pass, ``survival`` for the observer's counts. None when the kernels do not cover the slices."""

    def __call__(self, slices: StoredSlices, context: Any, counts: bool, survival: bool, /) -> KernelResult | None: ...


@dataclass(frozen=True)
class WouldKeep:
    """``shares(report, resolved params)``: per agent, the update mass the merged model keeps (the sum over
    its updated elements of the weight its own update gets), or None when the report lacks what it
    needs; ``estimated``: an estimate rather than an exact or expected value (drawn lighter)."""

    shares: Callable[[ProbeReport, dict], list[float] | None]
    estimated: bool = False


@dataclass(frozen=True)
class Sweep:
    """The parameter a comparison sweeps for this method and the values it offers, as typed in its form."""

    param: str
    values: str


def _params_only(params: dict, probe: ProbeReport | None, collected: Any) -> Any:
    return params


def _never(params: dict) -> bool:
    return False


@dataclass(frozen=True)
class MergeMethod:
    """A registered method (see the module docstring).

    ``needs_probe(params)``: ``prepare`` needs the whole-model probe before the merge pass (two passes
    unless a cached probe exists). ``collector(params, plan)``: a pass-1 statistic that is never cached;
    its ``finish()`` result reaches ``prepare(params, probe, collected)``. ``lambdas(params, probe)``:
    the per-agent scale of unique updates, for reports and cards (None: every λ is 1).
    ``thread_safe``: ``merge`` depends on nothing but the chunk and the context, so chunks may be merged
    in parallel and in any order. ``fused``: the method's ``FusedKernel`` for CPU passes (None: torch only).
    ``aux_inputs(params) -> {key: [Checkpoint per agent]}``: per-agent auxiliary checkpoints (Fisher
    information), opened (headers only), whose tensors carry the agents' names and shapes; the engine
    checks them against the plan and the reader streams their slices beside the agents', so ``merge``
    finds them as ``chunk.aux[key]`` (one raw slice per agent, in agent order). ``calibrated``: the faces
    turn its calibration suites into those inputs before merging (``evaluate.fisher``).
    ``would_keep``: the Analyze view's estimate (None: not shown). ``mergekit``: how it reads and writes
    mergekit configurations (None: not expressible, refused). ``sweep``: what a comparison offers (None:
    its first parameter at its default). ``short``: its label on charts (default: ``label``). ``citation``:
    the paper that defines it, as the model card cites it.

    ``whole_tensor``: ``merge`` needs whole-tensor statistics (norms, angles, ranks, cosines), so the engine
    hands it each tensor as one chunk (memory bounded by one tensor per compute thread, not by the chunk
    size). ``theta``: ``merge`` returns the merged weights θ (any float dtype; the engine rounds them once to
    the output dtype) instead of τ_merged; it reads the stored weights through ``chunk.thetas``.
    ``bind(context, plan) -> context``: called once after ``prepare`` with the plan, for what a context needs
    to know about the model (layer count for gradients, tensor shapes). Methods written before these
    fields existed leave them at their defaults and behave as before. ``stacks``: the method copies layers
    of a stacking layer map (passthrough); every other method merges all models in every slice.
    """

    name: str
    label: str
    summary: str
    params: tuple[Param, ...]
    merge: Callable[[Chunk, Any], torch.Tensor]
    prepare: Callable[[dict, ProbeReport | None, Any], Any] = _params_only
    needs_probe: Callable[[dict], bool] = _never
    collector: Callable[[dict, MergePlan], Collector] | None = None
    lambdas: Callable[[dict, ProbeReport], list[float]] | None = None
    observer: Callable[[dict, MergePlan], Observer] | None = None
    thread_safe: bool = False
    fused: FusedKernel | None = None
    aux_inputs: Callable[[dict], dict[str, list[Checkpoint]]] | None = None
    calibrated: bool = False
    would_keep: WouldKeep | None = None
    mergekit: MergekitMapping | None = None
    sweep: Sweep | None = None
    short: str = ""
    citation: str = ""
    whole_tensor: bool = False
    theta: bool = False
    bind: Callable[[Any, MergePlan], Any] | None = None
    stacks: bool = False  # reads a stacking layer map (each slice one model's layers) instead of merging models

    @property
    def short_label(self) -> str:
        return self.short or self.label

    def resolve(self, given: dict[str, Any]) -> dict[str, Any]:
        """Defaults filled in, values validated; unknown names are an error."""
        known = {p.name: p for p in self.params}
        unknown = [k for k, v in given.items() if k not in known and v is not None]
        if unknown:
            raise InputError(
                f"method {self.name} takes no parameter {', '.join(unknown)}; "
                f"its parameters: {', '.join(known) or 'none'}"
            )
        return {
            name: p.validate(given[name]) if given.get(name) is not None else p.default for name, p in known.items()
        }
