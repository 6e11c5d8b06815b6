"""The Session: what a merge is, shared by the window and the command line.

It holds the sources with their names, the method and its parameters, ε, device, output dtype, folder,
shard size and vocabulary policy, with one set of defaults (``defaults``). It converts to and from the
recipe file and to the engine's request; neither face assembles a request or a recipe by hand, so a
recipe saved in one runs in the other with the same bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import defaults
from .errors import InputError
from .methods import get_method
from .pipeline import MergeRequest, VariantSpec
from .recipe import Recipe

SAFE_NAME = re.compile(r"[^A-Za-z0-9._=-]+")


@dataclass(frozen=True)
class Variant:
    """One merge of a comparison: a name (its output folder's), a method and its parameters as given."""

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
            if key == "name":
                name = value.strip()
            elif key in params:
                raise InputError(f"variant {spec!r} gives {key} twice")
            else:
                params[key] = value.strip()
        name = name or SAFE_NAME.sub("_", spec).strip("._") or method
        if name in (".", "..") or "/" in name or "\\" in name:
            raise InputError(f"variant {spec!r}: {name!r} cannot be a folder name")
        variant = cls(name, method, params)
        variant.resolved()  # unknown parameter, value of the wrong type or out of range
        return variant

    def resolved(self, shared: dict[str, Any] | None = None) -> dict[str, Any]:
        """The method's parameters: its defaults, then the ``shared`` values it takes, then the variant's."""
        method = get_method(self.method)
        own = {p.name for p in method.params}
        given = {k: v for k, v in (shared or {}).items() if k in own and v is not None}
        given.update(self.params)
        try:
            return method.resolve(given)
        except InputError as e:
            raise InputError(f"variant {self.name!r}: {e}") from None


@dataclass
class Session:
    base: str = ""
    agents: list[str] = field(default_factory=list)
    names: list[str] | None = None  # None: names derived from the folders (plan.default_names)
    method: str = defaults.METHOD
    params: dict[str, Any] = field(
        default_factory=dict
    )  # the method's parameters as given (defaults filled on resolve)
    eps: float = defaults.EPS
    device: str = defaults.DEVICE
    out_dtype: str = defaults.OUT_DTYPE
    shard_size: str = defaults.SHARD_SIZE
    out: str | None = None
    vocab: str = defaults.VOCAB
    slices: list[dict[str, Any]] | None = None  # a layer map (recipe ``slices``); None: whole models

    def resolved_params(self) -> dict[str, Any]:
        """The method's parameters with its defaults filled in, validated (``InputError`` otherwise)."""
        return get_method(self.method).resolve(self.params)

    @classmethod
    def from_recipe(cls, recipe: Recipe) -> Session:
        return cls(
            base=recipe.base,
            agents=list(recipe.agents),
            names=list(recipe.names) if recipe.names else None,
            method=recipe.method,
            params=dict(recipe.params),
            eps=recipe.eps,
            device=recipe.device,
            out_dtype=recipe.out_dtype,
            shard_size=recipe.shard_size,
            out=recipe.out,
            vocab=recipe.vocab,
            slices=recipe.slices,
        )

    def to_recipe(self) -> Recipe:
        """The recipe of this session, parameters resolved (so the file states every value it ran with)."""
        return Recipe(
            base=self.base,
            agents=list(self.agents),
            method=self.method,
            params=self.resolved_params(),
            names=list(self.names) if self.names else None,
            eps=self.eps,
            out_dtype=self.out_dtype,
            shard_size=str(self.shard_size),
            device=self.device,
            out=self.out,
            vocab=self.vocab,
            slices=self.slices,
        )

    def to_request(
        self, out: str | Path | None = None, overwrite: bool = False, token: str | None = None, **engine_options: Any
    ) -> MergeRequest:
        """The engine request; ``out`` overrides the session's folder. ``token`` is for Hub sources only
        and is never stored in the session, the recipe or the report."""
        target = out if out is not None else self.out
        if not target:
            raise InputError("no output folder chosen; pass --out DIR (or choose one in the window)")
        if not self.base:
            raise InputError("no base model chosen; name the base the agents were fine-tuned from")
        return MergeRequest(
            self.base,
            list(self.agents),
            Path(target),
            self.method,
            self.resolved_params(),
            list(self.names) if self.names else None,
            self.eps,
            self.device,
            self.out_dtype,
            str(self.shard_size),
            overwrite,
            vocab=self.vocab,
            slices=self.slices,
            token=token,
            **engine_options,
        )

    def variant_specs(self, variants: list[Variant], out_dir: str | Path) -> list[VariantSpec]:
        """One engine spec per variant, each into ``out_dir/<name>``; the session's method parameters
        are the shared defaults a variant's own values override. Names must differ."""
        names = [v.name for v in variants]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise InputError(f"two variants are named {dupes[0]!r}; add name=... to one of them")
        return [VariantSpec(v.method, v.resolved(self.params), Path(out_dir) / v.name) for v in variants]
