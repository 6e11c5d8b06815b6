"""A comparison's variant: a spec delta (a method and the parameters it changes, with a name for its output
folder) applied to the spec every variant shares (``ram-merge compare``, the window's Compare tab)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import InputError
from .methods import get_method
from .spec import MergeSpec, split_params

SAFE_NAME = re.compile(r"[^A-Za-z0-9._=-]+")


@dataclass(frozen=True)
class Variant:
    """One merge of a comparison: a name (its output folder's), a method and its parameters as given; a
    per-agent value is one for every agent (``weight=0.5``) or keyed by agent (``weight.coder=0.5``)."""

    name: str
    method: str
    params: dict[str, Any]

    @classmethod
    def parse(cls, text: str) -> Variant:
        """``METHOD`` or ``METHOD:key=value,key=value`` with an optional ``name=...`` (default: the spec text
        made file-name safe), e.g. ``ram-plus:r=0.2,alpha=1.0``. Values are validated by the method."""
        spec = text.strip()
        method, _, rest = spec.partition(":")
        method = method.strip()
        get_method(method)  # unknown method: InputError listing the methods
        params: dict[str, Any] = {}
        name = None
        for part in filter(None, (p.strip() for p in rest.split(","))):
            key, eq, value = part.partition("=")
            key = key.strip().replace("-", "_")
            if not eq or not key or not value.strip():
                raise InputError(f"variant {spec!r}: {part!r} is not key=value; write it like ram-plus:r=0.2,alpha=1.0")
            param, dot, agent = key.partition(".")
            if key == "name":
                name = value.strip()
            elif dot:
                keyed = params.setdefault(param, {})
                if not isinstance(keyed, dict) or agent in keyed:
                    raise InputError(f"variant {spec!r} gives {param} of {agent} twice")
                keyed[agent] = value.strip()
            elif key in params:
                raise InputError(f"variant {spec!r} gives {key} twice")
            else:
                params[key] = value.strip()
        name = name or SAFE_NAME.sub("_", spec).strip("._") or method
        if name in (".", "..") or "/" in name or "\\" in name:
            raise InputError(f"variant {spec!r}: {name!r} cannot be a folder name")
        variant = cls(name, method, params)
        variant._check()  # unknown parameter, value of the wrong type or out of range
        return variant

    def _check(self) -> None:
        """The values that need no agents checked now (per-agent ones once applied to a spec)."""
        method = get_method(self.method)
        per_agent = {p.name for p in method.params if p.per_agent}
        own = {k: v for k, v in self.params.items() if not (k in per_agent and isinstance(v, dict))}
        try:
            method.resolve({k: v for k, v in own.items() if k not in per_agent or not isinstance(v, dict)})
        except InputError as e:
            raise InputError(f"variant {self.name!r}: {e}") from None

    def apply(self, shared: MergeSpec, folder: str | Path) -> MergeSpec:
        """``shared`` with this variant's method into ``folder/<name>``: the method's defaults, then the shared
        parameters it takes (the spec's and each agent's own), then the variant's (a keyed value replaces only
        the agents it names, one for every agent replaces each agent's own)."""
        method = get_method(self.method)
        own = {p.name for p in method.params}
        per_agent = {p.name for p in method.params if p.per_agent}
        given = {k: v for k, v in shared.params.items() if k in own and v is not None}
        agents = [{k: v for k, v in a.params.items() if k in own} for a in shared.agents]
        names = shared.names
        try:
            for key, value in self.params.items():
                if key in per_agent and isinstance(value, dict):  # weight.coder=0.5: the agents it names
                    for name, item in value.items():
                        if name not in names:
                            raise InputError(
                                f"parameters.{key}.{name}: no agent of that name; the agents are {', '.join(names)}"
                            )
                        agents[names.index(name)][key] = item
                    continue
                one, each = split_params(self.method, {key: value}, names)
                for values, more in zip(agents, each):
                    if key in one:
                        values.pop(key, None)
                    values.update(more)
                given.update(one)
            spec = shared.replace(
                method=self.method,
                params=given,
                agents=tuple(dataclasses.replace(a, params=v) for a, v in zip(shared.agents, agents)),
                output=str(Path(folder) / self.name),
            )
            spec.resolved_params()
        except InputError as e:
            raise InputError(f"variant {self.name!r}: {e}") from None
        return spec


def variant_specs(shared: MergeSpec, variants: Sequence[Variant], folder: str | Path) -> list[MergeSpec]:
    """One spec per variant, each into ``folder/<name>``; names must differ."""
    names = [v.name for v in variants]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise InputError(f"two variants are named {dupes[0]!r}; add name=... to one of them")
    return [v.apply(shared, folder) for v in variants]
