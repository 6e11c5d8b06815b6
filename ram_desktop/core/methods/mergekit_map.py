"""The shape of a method's mergekit mapping (``Interop.mergekit``), and the checks its converters share.

A method says which mergekit ``merge_method`` names it reads (``MergekitImport``: mergekit's defaults for
that method's shared and per-model parameters, and a converter to our parameters) and how it is written
back (``export``: the closest mergekit method, its parameters and a note on every difference).
``core.ecosystem.mergekit`` reads and writes the YAML around these and names no method.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError

TASK_ARITHMETIC_SHARED: Mapping[str, Any] = {"lambda": 1.0, "int8_mask": False}  # mergekit's GTA defaults


@dataclass
class MergekitInput:
    """A mergekit configuration's parameters for one method, defaults filled in and typed: ``shared``
    (``parameters``), ``per_model`` (each per-model key: (YAML path, value) per model that has it) and
    the warnings the converter adds to."""

    where: str
    method: str
    shared: dict[str, Any]
    per_model: dict[str, list[tuple[str, float]]]
    n_agents: int
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class MergekitImport:
    """One mergekit ``merge_method`` a method reads: mergekit's defaults for its shared and per-model
    parameters (None: no default) and ``convert(input) -> (our method, our parameters)``, raising
    ``InputError`` naming the key for what cannot be expressed."""

    name: str
    shared: Mapping[str, Any]
    per_model: Mapping[str, Any]
    convert: Callable[[MergekitInput], tuple[str, dict[str, Any]]]


@dataclass
class MergekitExport:
    """The closest mergekit form of one of our methods: ``merge_method``, its ``parameters``, each model's
    ``parameters`` and a note (a YAML comment) on every difference."""

    method: str
    shared: dict[str, Any] = field(default_factory=dict)
    per_model: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    per_agent: dict[str, list[Any]] = field(default_factory=dict)  # one value (setting) per agent, in agent order
    base: bool = True  # write base_model (False: the base only aligns the models; every model is an agent)
    dtype: str | None = "float32"  # mergekit's dtype (None: not written, the promotion of the inputs)


@dataclass(frozen=True)
class MergekitExact:
    """A mergekit ``merge_method`` this method computes with mergekit's own semantics, every parameter shape
    included (gradients, filters, per-model values): ``shared`` maps mergekit's shared parameter names to ours,
    ``per_model`` its per-model ones; ``base``: how the base takes part — ``required`` (θ_base is the base,
    the other models are the agents; a base listed among the models is that base), ``optional`` (as required
    when ``base_model`` is given, else every model is an agent and ``use_base`` is false), ``input`` (every
    model is an input in mergekit's order, the base appended last when given and not listed)."""

    name: str
    shared: Mapping[str, str]
    per_model: Mapping[str, str]
    base: str = "required"
    required: tuple[str, ...] = ()  # per-model parameters mergekit requires of every model (no default)
    agents: tuple[int, int | None] = (1, None)  # how many models besides the base it merges (at most: None)


@dataclass(frozen=True)
class MergekitMapping:
    """``export(resolved params, ε)``: our method as mergekit's; ``imports``: the mergekit methods it reads;
    ``exact``: the mergekit methods it computes with mergekit's semantics (``MergekitExact``). A configuration
    the classic ``imports`` refuse (per-model weights, gradients, filters, the base among the models) is
    read by the method that lists its ``merge_method`` in ``exact``."""

    export: Callable[[dict[str, Any], float], MergekitExport]
    imports: tuple[MergekitImport, ...] = ()
    exact: tuple[MergekitExact, ...] = ()


def all_equal(where: str, values: list[tuple[str, float]], what: str, must: float | None = None) -> float | None:
    """The one value every model gives (or None when none does); ``InputError`` naming the first that differs."""
    if not values:
        return None
    first_key, first = values[0]
    for key, value in values:
        if must is not None and value != must:
            raise InputError(f"{where}: {key} = {value:g}: {what}")
        if value != first:
            raise InputError(f"{where}: {key} = {value:g} differs from {first_key} = {first:g}: {what}")
    return first


def require_weights(given: MergekitInput) -> list[tuple[str, float]]:
    """Every model's ``weight`` (mergekit requires one for its linear and task-arithmetic family)."""
    weights = given.per_model["weight"]
    if len(weights) < given.n_agents:
        missing = given.n_agents - len(weights)
        raise InputError(
            f"{given.where}: models[*].parameters.weight: {missing} model(s) without a weight "
            f"(mergekit requires one for {given.method}); write weight: 1.0"
        )
    return weights


def unit_weights(given: MergekitInput) -> float:
    """The checks of a weighted task-vector sum: every weight 1 (the scale goes in ``lambda``); returns λ."""
    all_equal(
        given.where,
        require_weights(given),
        "RAM Desktop weights every agent by 1; put the scale in parameters.lambda",
        must=1.0,
    )
    return given.shared["lambda"]


def one_density(given: MergekitInput) -> float:
    """The one density every model gives."""
    density = all_equal(given.where, given.per_model["density"], "RAM Desktop uses one density for every agent")
    assert density is not None
    return density


def check_density(given: MergekitInput, density: float) -> None:
    """A density in (0, 1]."""
    if not 0.0 < density <= 1.0:
        raise InputError(f"{given.where}: models[*].parameters.density must be in (0, 1], got {density:g}")


def exact_export(
    exact: MergekitExact, notes: tuple[str, ...] = ()
) -> Callable[[dict[str, Any], float], MergekitExport]:
    """The export of a method that computes ``exact``'s mergekit method: every parameter as it is (gradients
    and filters included), per-agent values per model, the compute dtype as ``dtype``."""

    def export(params: dict[str, Any], eps: float) -> MergekitExport:
        shared = {theirs: params[ours] for theirs, ours in exact.shared.items() if params.get(ours) is not None}
        per_agent = {theirs: params[ours] for theirs, ours in exact.per_model.items() if params.get(ours) is not None}
        dtype = params.get("dtype", "float32")
        out = MergekitExport(
            exact.name,
            shared,
            {},
            list(notes),
            per_agent,
            base=exact.base != "input" and params.get("use_base", True) is not False,
            dtype=None if dtype == "inputs" else dtype,
        )
        return out

    return export
