"""What the methods that combine weights the way mergekit 0.1.5 does share (docs/methods.md, "Parameter values"):
the context that resolves a parameter per tensor (gradients over layers, filters by tensor name) and per
agent, the compute dtype, and the shared parameters.

These methods see whole tensors (``Streaming.whole_tensor``) and return θ (``Streaming.theta``): each
converts the stored weights to its compute dtype (``dtype``; ``inputs``: the promotion of the stored
dtypes, mergekit's default) and computes with the same operations, in the same order, as mergekit, so the
result is mergekit's to the bit; the engine rounds it once to the output dtype.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..engine.chunks import as_tensor
from ..errors import InputError, ParameterError
from ..lazy import torch
from . import settings
from .base import Param

if TYPE_CHECKING:
    import numpy as np

    from ..engine.chunks import Chunk
    from ..engine.plan import MergePlan

DTYPES = ("float32", "bfloat16", "float16", "float64", "inputs")
DTYPE = Param(
    "dtype",
    str,
    "float32",
    "compute dtype: the stored weights are converted to it before merging (inputs: "
    "the widest stored dtype, mergekit's default when its config sets no dtype)",
    choices=DTYPES,
)


def agent_param(
    name: str, default: float | None, help: str, minimum: float | None = None, maximum: float | None = None
) -> Param:
    """A per-agent parameter whose values may be gradients or filters (one setting per agent; None: default)."""
    return Param(name, float, default, help, minimum, maximum, per_agent=True, setting=True)


def shared_param(
    name: str, default: float | None, help: str, minimum: float | None = None, maximum: float | None = None
) -> Param:
    """A parameter of the whole merge whose value may be a gradient or filters."""
    return Param(name, float, default, help, minimum, maximum, setting=True)


@dataclass
class WeightsContext:
    """Resolved parameters plus what the plan tells (``bind``): decoder layer count and tensor shapes."""

    params: dict[str, Any]
    defaults: dict[str, Any]
    n_layers: int = 0
    shapes: dict[int, tuple[int, ...]] = field(default_factory=dict)
    # with a layer map (slices): per job, its gradient position and its slice's parameters (None: the recipe's)
    positions: dict[int, float] = field(default_factory=dict)
    groups: dict[int, int] = field(default_factory=dict)
    group_params: list[dict[str, Any] | None] = field(default_factory=list)
    models: dict[int, int] = field(default_factory=dict)  # stacking: per job, the model it is read from
    required: tuple[tuple[str, bool], ...] = ()  # given parameters without a default, per agent or not (``prepare``)

    def position(self, chunk: Chunk) -> float:
        """The tensor's gradient position t: the layer map's, else its layer index over the layer count."""
        return self.position_at(chunk.job_index, chunk.name)

    def position_at(self, job_index: int, name: str) -> float:
        t = self.positions.get(job_index)
        return settings.layer_position(name, self.n_layers) if t is None else t

    def params_of(self, chunk: Chunk) -> dict[str, Any]:
        """The parameters of this chunk's slice (the recipe's without a layer map or slice parameters)."""
        return self.params_at(chunk.job_index)

    def params_at(self, job_index: int) -> dict[str, Any]:
        if self.group_params:
            own = self.group_params[self.groups.get(job_index, 0)]
            if own is not None:
                return own
        return self.params

    def shared(self, key: str, chunk: Chunk) -> Any:
        """The value of parameter ``key`` for this chunk's tensor."""
        return self.shared_at(key, chunk.job_index, chunk.name)

    def shared_at(self, key: str, job_index: int, name: str) -> Any:
        """The value of parameter ``key`` for tensor ``name`` (job ``job_index`` of the plan)."""
        t = self.position_at(job_index, name)
        return settings.resolve([self.params_at(job_index).get(key)], name, t, _same, self.defaults.get(key))

    def agent(self, key: str, chunk: Chunk, agent: int, required: bool = True) -> Any:
        """Agent ``agent``'s value of per-agent parameter ``key`` for this chunk's tensor (``required``: a value
        must result; else None where neither the setting nor the default gives one)."""
        return self.agent_at(key, chunk.job_index, chunk.name, chunk.n_agents, agent, required)

    def agent_at(self, key: str, job_index: int, name: str, n_agents: int, agent: int, required: bool = True) -> Any:
        """``agent`` for tensor ``name`` (job ``job_index`` of the plan, ``n_agents`` agents)."""
        values = self.params_at(job_index).get(key)
        setting = values  # one value (or setting) for every agent
        if isinstance(values, list):
            if len(values) != n_agents:
                reason = f"gives {len(values)} values for {n_agents} agents; give one per agent, in agent order"
                raise ParameterError(f"parameter {key} {reason}", key, values, reason)
            setting = values[agent]
        t = self.position_at(job_index, name)
        value = settings.resolve([setting], name, t, _same, self.defaults.get(key))
        if value is None and required:
            raise ParameterError(
                f"parameter {key} has no value for agent {agent + 1} at tensor {name!r}",
                key,
                setting,
                f"has no value at tensor {name!r}",
                agent,
            )
        return value

    def agents(self, key: str, chunk: Chunk) -> list[Any]:
        return [self.agent(key, chunk, t) for t in range(chunk.n_agents)]

    def dtype(self, chunk: Chunk) -> torch.dtype:
        """The compute dtype of this chunk (``inputs``: the promotion of the stored dtypes)."""
        return self.dtype_of(chunk.raw or [chunk.base])

    def dtype_of(self, stored: Sequence[torch.Tensor | np.ndarray]) -> torch.dtype:
        """The compute dtype for slices as stored (tensors, or the fused path's numpy bits)."""
        name = self.params.get("dtype", "float32")
        if name != "inputs":
            return getattr(torch, name)
        out = as_tensor(stored[0]).dtype
        for r in stored[1:]:
            out = torch.promote_types(out, as_tensor(r).dtype)
        return out

    def shape(self, chunk: Chunk) -> tuple[int, ...]:
        return self.shapes.get(chunk.job_index, (chunk.base.numel(),))


def _same(value: Any) -> Any:
    return value


def prepare(params: dict, method_params: tuple[Param, ...], required: tuple[str, ...] = ()) -> WeightsContext:
    """The context of a merge. ``required``: the parameters mergekit 0.1.5 requires (no default there): once
    given, their setting must give every tensor a value; a tensor it leaves without one (filters that match
    nothing, no entry without a filter) is refused by ``bind``, as mergekit refuses it, instead of falling
    back to our default. Not given at all, they take our default."""
    ctx = WeightsContext(dict(params), {p.name: p.default for p in method_params})
    given = [p for p in method_params if p.name in required and params.get(p.name) is not None]
    for p in given:
        ctx.defaults[p.name] = None
    ctx.required = tuple((p.name, p.per_agent) for p in given)
    return ctx


def bind(ctx: WeightsContext, plan: MergePlan) -> WeightsContext:
    names = [j.name for j in plan.jobs]
    ctx.n_layers = settings.count_layers(names)
    ctx.shapes = {i: tuple(j.shape) for i, j in enumerate(plan.jobs)}
    if plan.layout is not None:
        ctx.positions = {i: j.position for i, j in enumerate(plan.jobs) if j.position is not None}
        ctx.groups = {i: j.group for i, j in enumerate(plan.jobs)}
        ctx.models = {i: j.model for i, j in enumerate(plan.jobs)}
    _check_required(ctx, plan)
    return ctx


def _check_required(ctx: WeightsContext, plan: MergePlan) -> None:
    """Before anything is read or written: every required parameter (``prepare``) has a value for every
    tensor the method merges."""
    mergeable = {id(j) for j in plan.mergeable_jobs}
    for key, is_per_agent in ctx.required:
        setting = ctx.params.get(key)
        per_agent = setting if is_per_agent and isinstance(setting, list) else None
        for index, job in enumerate(plan.jobs):
            if id(job) not in mergeable:
                continue
            t = ctx.position_at(index, job.name)
            for agent, value in enumerate(per_agent if per_agent is not None else [setting]):
                if settings.resolve([value], job.name, t, _same, None) is None:
                    who = f" of agent {agent + 1}" if per_agent is not None else ""
                    reason = (
                        f"has no value for tensor {job.name!r}: its filters match nothing there and {key} has no "
                        "default (mergekit 0.1.5 refuses this too); add an entry without a filter"
                    )
                    raise ParameterError(
                        f"parameter {key}{who} {reason}",
                        key,
                        value,
                        reason,
                        agent if per_agent is not None else None,
                    )


def check_count(method: str, n: int, minimum: int, maximum: int | None = None) -> None:
    if n < minimum or (maximum is not None and n > maximum):
        want = f"exactly {minimum}" if minimum == maximum else f"at least {minimum}"
        raise InputError(f"{method} merges {want} agent(s); got {n}")


def is_close_to_zero(x: float) -> bool:
    return math.isclose(x, 0.0, abs_tol=1e-6)
