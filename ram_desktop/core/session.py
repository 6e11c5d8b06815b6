"""The Session: what a merge is, shared by the window and the command line.

It holds the sources with their names, the method and its parameters, ε, device, output dtype, folder,
shard size and vocabulary policy, with one set of defaults (``defaults``). It converts to and from the
recipe file and to the engine's request; neither face assembles a request or a recipe by hand, so a
recipe saved in one runs in the other with the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import defaults
from .engine import MergeRequest
from .errors import InputError
from .methods import get_method
from .recipe import Recipe


@dataclass
class Session:
    base: str = ""
    agents: list[str] = field(default_factory=list)
    names: list[str] | None = None  # None: names derived from the folders (plan.default_names)
    method: str = defaults.METHOD
    params: dict[str, Any] = field(default_factory=dict)  # the method's parameters as given (defaults filled on resolve)
    eps: float = defaults.EPS
    device: str = defaults.DEVICE
    out_dtype: str = defaults.OUT_DTYPE
    shard_size: str = defaults.SHARD_SIZE
    out: str | None = None
    vocab: str = defaults.VOCAB

    def resolved_params(self) -> dict[str, Any]:
        """The method's parameters with its defaults filled in, validated (``InputError`` otherwise)."""
        return get_method(self.method).resolve(self.params)

    @classmethod
    def from_recipe(cls, recipe: Recipe) -> "Session":
        return cls(base=recipe.base, agents=list(recipe.agents), names=list(recipe.names) if recipe.names else None,
                   method=recipe.method, params=dict(recipe.params), eps=recipe.eps, device=recipe.device,
                   out_dtype=recipe.out_dtype, shard_size=recipe.shard_size, out=recipe.out, vocab=recipe.vocab)

    def to_recipe(self) -> Recipe:
        """The recipe of this session, parameters resolved (so the file states every value it ran with)."""
        return Recipe(base=self.base, agents=list(self.agents), method=self.method, params=self.resolved_params(),
                      names=list(self.names) if self.names else None, eps=self.eps, out_dtype=self.out_dtype,
                      shard_size=str(self.shard_size), device=self.device, out=self.out, vocab=self.vocab)

    def to_request(self, out: str | Path | None = None, overwrite: bool = False, token: str | None = None,
                   **engine_options: Any) -> MergeRequest:
        """The engine request; ``out`` overrides the session's folder. ``token`` is for Hub sources only
        and is never stored in the session, the recipe or the report."""
        target = out if out is not None else self.out
        if not target:
            raise InputError("no output folder chosen; pass --out DIR (or choose one in the window)")
        if not self.base:
            raise InputError("no base model chosen; name the base the agents were fine-tuned from")
        return MergeRequest(self.base, list(self.agents), Path(target), self.method, self.resolved_params(),
                            list(self.names) if self.names else None, self.eps, self.device, self.out_dtype,
                            str(self.shard_size), overwrite, vocab=self.vocab, token=token, **engine_options)
