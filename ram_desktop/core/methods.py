"""Merge methods: small pure functions on chunks, registered with the parameter schema that the
command line flags and the GUI form are generated from.

A method's ``merge`` receives a ``Chunk`` (base slice and task vectors in the compute dtype) and the
context its ``prepare`` built from whole-model statistics, and returns the merged task vector
τ_merged for that slice. The executor adds it to the base and rounds once to the output dtype.
Sums over agents run in a fixed order (agent 0, 1, ...) so every device gives the same bits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch

from .chunks import PATTERN_MAX_AGENTS, Chunk
from .errors import InputError
from .probe import ProbeReport


@dataclass(frozen=True)
class Param:
    """One method parameter: its type, default, allowed range and the help shown as a tooltip."""

    name: str
    kind: type  # float, int or str
    default: Any
    help: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] | None = None
    paper_range: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def validate(self, value: Any) -> Any:
        try:
            value = self.kind(value)
        except (TypeError, ValueError):
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
        parts = [self.help, f"default {self.default}"]
        if self.choices:
            parts.append("one of " + "|".join(self.choices))
        elif self.minimum is not None or self.maximum is not None:
            parts.append(f"allowed {self.minimum if self.minimum is not None else '-inf'}.."
                         f"{self.maximum if self.maximum is not None else 'inf'}")
        if self.paper_range:
            parts.append(f"paper search range {self.paper_range}")
        return "; ".join(parts)


class Collector(Protocol):
    """Extra whole-model statistics a method gathers in pass 1 (e.g. TIES's magnitude cut)."""

    def add(self, chunk: Chunk) -> None: ...

    def finish(self) -> Any: ...

    # Optional: ``next_pass() -> bool`` is called after each full pass over the data; True asks the
    # engine to feed every chunk once more (in the same order) before ``finish`` (TIES's exact cut).


@dataclass(frozen=True)
class MergeMethod:
    """A registered method.

    ``needs_probe(params)``: ``prepare`` needs the whole-model probe before the merge pass (two passes
    unless a cached probe exists). ``collector(params, plan)``: a pass-1 statistic that is never cached;
    its ``finish()`` result reaches ``prepare(params, probe, collected)``.
    """

    name: str
    label: str
    summary: str
    params: tuple[Param, ...]
    merge: Callable[[Chunk, Any], torch.Tensor]
    prepare: Callable[[dict, ProbeReport | None, Any], Any] = lambda params, probe, collected: params
    needs_probe: Callable[[dict], bool] = lambda params: False
    collector: Callable[[dict, Any], "Collector"] | None = None
    lambdas: Callable[[dict, ProbeReport], list[float]] | None = None
    extra: dict = field(default_factory=dict)  # "thread_safe": True lets the CPU merge run chunks in parallel threads

    def resolve(self, given: dict[str, Any]) -> dict[str, Any]:
        """Defaults filled in, values validated; unknown names are an error."""
        known = {p.name: p for p in self.params}
        unknown = [k for k, v in given.items() if k not in known and v is not None]
        if unknown:
            raise InputError(f"method {self.name} takes no parameter {', '.join(unknown)}; "
                             f"its parameters: {', '.join(known) or 'none'}")
        return {name: p.validate(given[name]) if given.get(name) is not None else p.default
                for name, p in known.items()}


METHODS: dict[str, MergeMethod] = {}


def register(method: MergeMethod) -> MergeMethod:
    METHODS[method.name] = method
    return method


def get_method(name: str) -> MergeMethod:
    try:
        return METHODS[name]
    except KeyError:
        raise InputError(f"unknown method {name!r}; choose one of {', '.join(METHODS)}") from None


# --- RAM, RAM+, RAM+s (paper equations 6, 7, 8) -------------------------------------------------

def ram_plus_lambdas(params: dict, probe: ProbeReport) -> list[float]:
    """λ_t = 1 + r · clip(ρ_t, 0, α), with clip(∞) = α (equation 6)."""
    return [1.0 + params["r"] * min(max(a.rho, 0.0), params["alpha"]) for a in probe.agents]


def ram_plus_soft_lambdas(params: dict, probe: ProbeReport) -> list[float]:
    """λ_t = 1 + r · ρ_t / (1 + ρ_t) = 1 + r · shared_t / updated_t (equation 8); 1 when nothing is updated."""
    return [1.0 + params["r"] * (a.shared / a.updated) if a.updated else 1.0 for a in probe.agents]


def selective_merge(chunk: Chunk, lambdas: list[float] | None) -> torch.Tensor:
    """Equation 7: 0 where no agent updates, λ_t·τ_t where only agent t does, the mean of the
    active agents' τ where two or more do.

    One kernel for every case: total = Σ_t [m_t]·τ_t (agents in order 0..N−1), then
    total · A[p] / B[p] with p the update pattern, A[p] = λ_t for the one-agent pattern 2^t (else 1)
    and B[p] = max(1, popcount p). Multiplying or dividing by 1 is exact, so this is bit-identical to
    λ_t·τ_t, total / c and 0 computed separately.
    """
    n = chunk.n_agents
    if n > PATTERN_MAX_AGENTS:
        return _selective_merge_masks(chunk, lambdas)
    dtype, device = chunk.base.dtype, chunk.base.device
    pattern = chunk.pattern
    size = (chunk.base.numel(),)
    # [m_t]·τ_t as a multiply by the 0/1 mask values (several times faster than torch.where on CPU). It gives −0
    # instead of +0 where a negative τ is masked out; adding +0 at the end restores the reference's
    # bits: a sum of ±0 and nonzero terms differs from the +0-based sum only by the sign of an
    # all-zero result (only possible where no agent updates), and x + (+0) = x for every other x.
    # total = ((τ_0·m_0 + τ_1·m_1) + τ_2·m_2) + ..., the products fused into the sums with addcmul: a
    # product by 0.0 or 1.0 is exact, so a fused multiply-add rounds exactly like the separate ops.
    m = chunk.mask_values
    total = torch.mul(chunk.taus[0], m[0], out=chunk._buffer("total", size, dtype))
    for t in range(1, n):
        total.addcmul_(chunk.taus[t], m[t])
    total.add_(0.0)
    mul, div = _pattern_factors(n, tuple(lambdas) if lambdas is not None else None, dtype, device)
    factor = chunk._buffer("factor", size, dtype)
    if lambdas is not None:
        # scaled into its own buffer: Σ_t [m_t]·τ_t stays available (``chunk.unscaled``), and where one
        # agent updates it is that agent's τ, which the merge pass's exact survival count needs
        chunk.unscaled = total
        total = torch.mul(total, torch.index_select(mul, 0, pattern, out=factor),
                          out=chunk._buffer("scaled", size, dtype))
    if n > 1:
        # B[p] = max(1, popcount p) is Σ_t m_t clamped at 1: the same small integers as the table, summed
        # from the 0/1 mask values with vectorised adds (cheaper than a second lookup)
        count = torch.add(m[0], m[1], out=chunk._buffer("count", size, dtype))
        for t in range(2, n):
            count.add_(m[t])
        total.div_(count.clamp_min_(1.0))
    return total


_FACTORS: dict = {}


def _pattern_factors(n: int, lambdas: tuple[float, ...] | None, dtype: torch.dtype,
                     device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Lookup tables over the 2^n update patterns: the unique-update scale and the overlap count."""
    key = (n, lambdas, dtype, str(device))
    if key not in _FACTORS:
        if len(_FACTORS) > 64:
            _FACTORS.clear()
        mul = torch.ones(1 << n, dtype=dtype)
        div = torch.ones(1 << n, dtype=dtype)
        for p in range(1, 1 << n):
            c = bin(p).count("1")
            div[p] = c
            if c == 1 and lambdas is not None:
                mul[p] = torch.tensor(lambdas[p.bit_length() - 1], dtype=dtype)
        _FACTORS[key] = (mul.to(device), div.to(device))
    return _FACTORS[key]


def _selective_merge_masks(chunk: Chunk, lambdas: list[float] | None) -> torch.Tensor:
    """The same result for many agents, from the masks and counts directly."""
    masks, counts = chunk.masks, chunk.counts
    total = torch.zeros_like(chunk.base)
    scaled = torch.zeros_like(chunk.base) if lambdas is not None else None
    for t in range(chunk.n_agents):
        active = torch.where(masks[t], chunk.taus[t], 0.0)
        total += active
        if scaled is not None:
            scaled += active * torch.tensor(lambdas[t], dtype=chunk.base.dtype, device=chunk.base.device)
    unique_value = scaled if scaled is not None else total
    mean = total / counts.clamp(min=1).to(chunk.base.dtype)
    return torch.where(counts == 1, unique_value, torch.where(counts >= 2, mean, 0.0))


R = Param("r", float, 0.1, "rescaling strength r of unique updates", 0.0, 10.0, paper_range="0.1; ablation 0.0-0.2 (Table 2)")
ALPHA = Param("alpha", float, 2.0, "upper clip α of the overlap-unique ratio ρ", 0.0, 1000.0,
              paper_range="2.0 (paper setting)")

register(MergeMethod(
    "ram", "RAM", "Average where agents overlap, keep unique updates whole (λ = 1).",
    (), lambda chunk, ctx: selective_merge(chunk, None),
    extra={"thread_safe": True, "kernel": "ram"},  # kernel: CPU passes use kernels.selective_merge_into
))
register(MergeMethod(
    "ram-plus", "RAM+", "RAM with unique updates rescaled by λ_t = 1 + r·clip(ρ_t, 0, α).",
    (R, ALPHA),
    lambda chunk, ctx: selective_merge(chunk, ctx),
    prepare=lambda params, probe, collected: ram_plus_lambdas(params, probe),
    needs_probe=lambda params: True,
    lambdas=ram_plus_lambdas,
    extra={"thread_safe": True, "kernel": "ram-plus"},  # the context is λ per agent
))
register(MergeMethod(
    "ram-plus-soft", "RAM+s", "RAM with soft-saturated rescaling λ_t = 1 + r·ρ_t/(1+ρ_t) (paper appendix E).",
    (R,),
    lambda chunk, ctx: selective_merge(chunk, ctx),
    prepare=lambda params, probe, collected: ram_plus_soft_lambdas(params, probe),
    needs_probe=lambda params: True,
    lambdas=ram_plus_soft_lambdas,
    extra={"thread_safe": True, "kernel": "ram-plus"},
))


# The baselines register themselves on import, so every user of the registry sees them.
from . import baselines  # noqa: E402,F401
