"""The contract every merge method fulfils; the engine reads these typed fields instead of flags.

A method is a value in named parts (``MergeMethod``): who it is and its parameter schema (the CLI flags
and the GUI form are generated from it); the merge itself, a ``prepare`` that turns parameters and
statistics into the merge context, a ``bind`` to the plan and a pure ``merge(chunk, context) -> τ_merged``
that returns a value and never writes into the chunk for another module to read; ``streaming``, how the
passes feed it (the engine's ``contracts.Streaming``: threads, whole tensors, θ, its fused CPU kernel,
auxiliary inputs); ``analysis``, the whole-model statistics it needs or reports (probe, collectors,
observer, λ, would-keep); ``interop``, how it meets mergekit, comparisons, calibration and model cards.

Everything specific to a method is a field, so code outside ``methods/`` never branches on a method's
name. The contract types the passes read (``Collector``, ``SliceCollector``, ``Observer``, ``SliceObserver``,
``FusedKernel``, ``FusedGroupKernel``, ``Streaming``) belong to the engine (``engine.contracts``); they are
re-exported here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from ..engine.contracts import (
    Collector,
    FusedGroupKernel,
    FusedKernel,
    Observer,
    ProbeStatistic,
    SliceCollector,
    SliceObserver,
    Streaming,
)
from ..errors import ParameterError
from ..lazy import torch
from .mergekit_map import MergekitMapping

if TYPE_CHECKING:
    from ..engine.chunks import Chunk
    from ..engine.plan import MergePlan
    from ..engine.probe import ProbeReport

__all__ = [
    "Analysis",
    "Collector",
    "FusedGroupKernel",
    "FusedKernel",
    "Interop",
    "MergeMethod",
    "Observer",
    "Param",
    "SliceCollector",
    "SliceObserver",
    "Streaming",
    "Sweep",
    "WouldKeep",
    "plan_warnings",
]


# what a value of a kind must be, in words (a ``ParameterError``'s reason; the command line names the type)
KIND_WORDS = {"float": "must be a number", "int": "must be a whole number"}


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
    # the name shown to a reader where the recipe key is a code (``ties_scope``: "trim scope"); default ``name``
    label: str = ""

    @property
    def title(self) -> str:
        return self.label or self.name

    @property
    def flag(self) -> str:
        return "--" + (self.flag_name or self.name).replace("_", "-")

    def validate(self, value: Any) -> Any:
        if self.setting:
            return self._validate_setting(value)
        if self.per_agent:
            items = value.split(",") if isinstance(value, str) else value
            if not isinstance(items, (list, tuple)):
                reason = "takes one value per agent, comma-separated"
                raise ParameterError(f"{self.flag} {reason}; got {value!r}", self.name, value, reason)
            items = [i.strip() if isinstance(i, str) else i for i in items]
            if not items or any(i == "" or i is None for i in items):
                raise self._empty_entry(value)
            return [self._validate_agent(k, self._validate_one, i) for k, i in enumerate(items)]
        return self._validate_one(value)

    def _empty_entry(self, value: Any) -> ParameterError:
        reason = "has an empty entry; give one value per agent, in agent order"
        return ParameterError(
            f"{self.flag} has an empty entry ({value!r}); give one value per agent, in agent order",
            self.name,
            value,
            reason,
        )

    def _validate_agent(self, agent: int, validate: Callable[[Any], Any], value: Any) -> Any:
        """``validate(value)`` for the value of the agent at position ``agent``: a refusal names that agent."""
        try:
            return validate(value)
        except ParameterError as e:
            raise e.at(self.name, agent) from None

    def _validate_setting(self, value: Any) -> Any:
        """A setting (``settings.check_setting``); per agent a list of them (text: comma-separated numbers)."""
        from .settings import check_setting

        try:
            if not self.per_agent:
                return check_setting(self.flag, value, self._validate_one)
            if isinstance(value, str) and "," not in value or not isinstance(value, (str, list, tuple)):
                return check_setting(
                    self.flag, value.strip() if isinstance(value, str) else value, self._validate_one
                )  # one value (or setting) for every agent
        except ParameterError as e:
            raise e.at(self.name) from None
        items = value.split(",") if isinstance(value, str) else value
        items = [i.strip() if isinstance(i, str) else i for i in items]
        if not items or any(i == "" for i in items):
            raise self._empty_entry(value)
        return [
            None
            if i is None
            else self._validate_agent(k, partial(check_setting, f"{self.flag}[{k}]", validate=self._validate_one), i)
            for k, i in enumerate(items)
        ]

    def _validate_one(self, value: Any) -> Any:
        if self.kind is bool:  # true/false (YAML booleans, or their text from a command line or form)
            text = str(value).strip().lower() if isinstance(value, (bool, str)) else None
            if text not in ("true", "false"):
                raise self._refused("must be true or false", value, f"{value!r}")
            return text == "true"
        try:
            if self.kind is int and isinstance(value, float) and not value.is_integer():
                raise ValueError
            value = self.kind(value)
        except (TypeError, ValueError, OverflowError):
            raise self._refused(
                KIND_WORDS.get(self.kind.__name__, f"must be a {self.kind.__name__}"),
                value,
                f"{value!r}",
                f"must be a {self.kind.__name__}",
            ) from None
        if self.kind is float and not math.isfinite(value):
            raise self._refused("must be a finite number", value, f"{value!r}")
        if self.choices is not None and value not in self.choices:
            raise self._refused(f"must be one of {', '.join(self.choices)}", value, f"{value!r}")
        if self.minimum is not None and value < self.minimum:
            raise self._refused(f"must be at least {self.minimum}", value, f"{value}")
        if self.maximum is not None and value > self.maximum:
            raise self._refused(f"must be at most {self.maximum}", value, f"{value}")
        return value

    def _refused(self, reason: str, value: Any, shown: str, flag_words: str | None = None) -> ParameterError:
        """``value`` refused: the command line's message (``--flag <flag_words or reason>, got <shown>``) and
        the fields a face words it from."""
        return ParameterError(f"{self.flag} {flag_words or reason}, got {shown}", self.name, value, reason)

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
class Analysis:
    """What a method needs from the whole-model statistics, and what it tells about them.

    ``needs_probe(params)``: ``prepare`` needs the whole-model probe before the merge pass (two passes unless a
    cached probe exists). ``collector(params, plan)``: a pass-1 statistic that is never cached; its ``finish()``
    result reaches ``prepare(params, probe, collected)``. ``observer(params, plan)``: watches every merged chunk
    (RAM+'s exact rounding survival count); a ``SliceObserver`` also takes what the method's fused kernel counts.
    ``observed_as``: the merge report's key its observer's ``finish()`` goes under (replacing what the probe statistic
    states under that key, when it counted something). ``probe_statistic``: a statistic of the agents' unique
    elements this method adds to the Analyze probe (``engine.contracts.ProbeStatistic``; the registry's
    ``PROBE_STATISTICS`` gathers them, and the probe counts them whichever method is chosen). ``lambdas(params,
    probe)``: the per-agent scale of unique updates, for reports and cards (None: every λ is 1). ``would_keep``: the
    Analyze view's estimate (None: not shown). ``selective``: the merge is RAM's selective rule, which ρ and λ
    describe (the ρ–λ columns and notes)."""

    needs_probe: Callable[[dict], bool] = _never
    collector: Callable[[dict, MergePlan], Collector] | None = None
    observer: Callable[[dict, MergePlan], Observer] | None = None
    observed_as: str = ""
    probe_statistic: ProbeStatistic | None = None
    lambdas: Callable[[dict, ProbeReport], list[float]] | None = None
    would_keep: WouldKeep | None = None
    # RAM's selective rule (unique updates kept, shared ones averaged): the probe's ρ and the λ it gives describe
    # the merge, so the faces show the ρ–λ table and RAM's own notes; every other method's messages leave them out
    selective: bool = False


@dataclass(frozen=True)
class Interop:
    """How a method meets the world outside the merge: ``mergekit``, how it reads and writes mergekit
    configurations (None: not expressible, refused); ``sweep``, what a comparison offers (None: its first
    parameter at its default); ``calibration``, the parameters that say what a calibrated method is calibrated
    on and what that gave (Fisher's suites, examples and Fisher folders): the faces turn its calibration suites
    into its auxiliary inputs before merging (``evaluate.fisher``), and search sets them once for all its trials
    and never varies them (``calibrated``: it has some); ``citation``, the paper that defines it, as the model card cites it;
    ``searched_by_default``, ``ram-merge search`` (and the window's Search) tries it when no methods are named
    (the registry's ``SEARCH_METHODS``); ``search_reference``, the search scores it at its defaults beside the
    best trial on the test suites (``SEARCH_REFERENCES``)."""

    mergekit: MergekitMapping | None = None
    sweep: Sweep | None = None
    calibration: tuple[str, ...] = ()
    citation: str = ""
    searched_by_default: bool = False
    search_reference: bool = False

    @property
    def calibrated(self) -> bool:
        return bool(self.calibration)


RANK_TIES_ON_GPU = 0.02
"""``gpu_tolerance`` of a method that keeps elements by rank (top-k, sort, quantile) on whole tensors: torch's
CUDA kernels order equal magnitudes otherwise than its CPU kernels, so another element of a tie is kept there
(0.36–1.61 % of elements on the test layout, measured on an H200), as mergekit --cuda differs from mergekit on
the CPU."""


@dataclass(frozen=True)
class MergeMethod:
    """A registered method (see the module docstring), in named parts.

    Who it is: ``name``, ``label``, ``summary``, ``params`` (the schema the CLI flags, the GUI form and the
    recipe are generated from), ``short`` (its label on charts; default ``label``).
    The merge: ``merge(chunk, context)``, pure, returning τ_merged (θ with ``streaming.theta``);
    ``prepare(params, probe, collected) -> context`` before the merge pass; ``bind(context, plan) -> context``,
    called once after ``prepare`` with the plan, for what a context needs to know about the model (layer
    count for gradients, tensor shapes, which tensors are linear layers).
    ``streaming`` (``engine.contracts.Streaming``): how the merge pass feeds it. ``analysis`` (``Analysis``):
    probe, collectors, observer, λ and would-keep. ``interop`` (``Interop``): mergekit, comparison sweep,
    calibration, citation. Every method uses the same hooks; a part left out takes its defaults.
    """

    name: str
    label: str
    summary: str
    params: tuple[Param, ...]
    merge: Callable[[Chunk, Any], torch.Tensor]
    prepare: Callable[[dict, ProbeReport | None, Any], Any] = _params_only
    bind: Callable[[Any, MergePlan], Any] | None = None
    streaming: Streaming = field(default_factory=Streaming)
    analysis: Analysis = field(default_factory=Analysis)
    interop: Interop = field(default_factory=Interop)
    short: str = ""
    agents: tuple[int, int | None] = (1, None)  # how many agents it merges: at least, at most (None: any)
    # the share of elements whose bytes on a GPU may differ from the CPU's (docs/methods.md, "On a GPU"); 0: the same
    gpu_tolerance: float = 0.0

    @property
    def short_label(self) -> str:
        return self.short or self.label

    @property
    def rescales(self) -> bool:
        """Unique updates are scaled by a per-agent λ (RAM+, RAM+s): a bf16 output can round that away."""
        return self.analysis.lambdas is not None

    def resolve(self, given: dict[str, Any]) -> dict[str, Any]:
        """Defaults filled in, values validated; unknown names are an error."""
        known = {p.name: p for p in self.params}
        unknown = [k for k, v in given.items() if k not in known and v is not None]
        if unknown:
            raise ParameterError(
                f"method {self.name} takes no parameter {', '.join(unknown)}; "
                f"its parameters: {', '.join(known) or 'none'}",
                unknown[0],
                given[unknown[0]],
                f"is not a parameter of method {self.name}; its parameters: {', '.join(known) or 'none'}",
            )
        return {
            name: p.validate(given[name]) if given.get(name) is not None else p.default for name, p in known.items()
        }


def plan_warnings(method: MergeMethod | None, plan: MergePlan) -> list[str]:
    """Warnings about the inputs that depend on the method (None: an analysis, no method yet): one agent only,
    and an agent that is the base checkpoint itself (expected where the method stacks the models' layers)."""
    warnings = []
    if plan.n_agents == 1:
        if method is None:
            warnings.append("only one agent: there is no other agent to merge it with, only the base")
        elif method.analysis.selective:
            warnings.append(
                f"only one agent: {method.label} keeps every update of it above ε, so the merge reproduces that "
                "agent (no update is shared: ρ = 0, λ = 1)"
            )
        else:
            warnings.append(f"only one agent: {method.label} combines it with the base alone")
    if method is None or not method.streaming.stacks:
        warnings += [f"agent {name!r} is the base checkpoint itself" for name in plan.base_agents]
    return warnings
