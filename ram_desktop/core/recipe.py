"""``ram-recipe.yaml``: everything needed to reproduce a merge, written by every merge and run by
``ram-merge run`` and the GUI's File > Open recipe."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import defaults
from .engine.plan import Layout, Slice, SliceSource, check_agent_count
from .errors import InputError
from .storage.safe_read import read_yaml

FORMAT = "ram-recipe/1"
SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
UNITS = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}


def parse_size(text: str | int) -> int:
    """'5GB' -> 5_000_000_000 (decimal, as Hugging Face uses), '2GiB' -> 2**31, plain ints are bytes."""
    if isinstance(text, int):
        value = text
    else:
        m = SIZE.match(str(text))
        if not m:
            raise InputError(f"cannot read size {text!r}; write it like 5GB, 500MB or 2GiB")
        value = int(float(m.group(1)) * UNITS[(m.group(2) or "B").upper()])
    if value <= 0:
        raise InputError(f"size {text!r} must be positive")
    return value


@dataclass
class Recipe:
    base: str
    agents: list[str]
    method: str = defaults.METHOD
    params: dict[str, Any] = field(default_factory=dict)
    names: list[str] | None = None
    eps: float = defaults.EPS
    out_dtype: str = defaults.OUT_DTYPE
    shard_size: str = defaults.SHARD_SIZE
    device: str = defaults.DEVICE
    out: str | None = None
    vocab: str = defaults.VOCAB  # "common": merge shared vocabulary rows (written only when not the default)
    # a layer map (docs/contracts.md, "slices"): each {"sources": [{"model": i, "layer_range": [a, b]}, ...],
    # optionally "parameters"}; model 0 is the base, i the i-th agent. None: whole models (not written)
    slices: list[dict[str, Any]] | None = None

    def layout(self) -> Layout | None:
        return layout_of(self.slices)

    def to_yaml(self) -> str:
        data = {
            "format": FORMAT,
            "method": self.method,
            "parameters": dict(self.params),
            "eps": self.eps,
            "base": self.base,
            "agents": [
                {"name": n, "source": s} if n else {"source": s}
                for n, s in zip(self.names or [""] * len(self.agents), self.agents)
            ],
            "out_dtype": self.out_dtype,
            "shard_size": self.shard_size,
            "device": self.device,
        }
        if self.vocab != defaults.VOCAB:
            data["vocab"] = self.vocab
        if self.slices is not None:
            data["slices"] = [dict(s) for s in self.slices]
        if self.out:
            data["output"] = self.out
        head = "# RAM Desktop merge recipe. Reproduce with: ram-merge run ram-recipe.yaml [--out DIR]\n"
        return head + yaml.safe_dump(data, sort_keys=False, allow_unicode=True)

    def save(self, path: Path) -> None:
        path.write_text(self.to_yaml(), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> Recipe:
        return cls.from_dict(read_yaml(path), str(path))

    @classmethod
    def from_dict(cls, data: Any, where: str = "recipe") -> Recipe:
        """A recipe from its parsed YAML. Every key is checked: an unknown or misplaced key, or a value of the
        wrong type, is refused naming it (a typo must never change a merge silently)."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise InputError(f"{where}: not a RAM Desktop recipe (needs 'format: {FORMAT}')")
        _known_keys(where, "", data, RECIPE_KEYS)
        for key in ("base", "agents"):
            if key not in data:
                raise InputError(f"{where}: {key}: missing; a recipe needs base and agents")
        agents = data["agents"]
        if not isinstance(agents, list) or not agents:
            raise InputError(
                f"{where}: agents: expected a list of agents (each a path, a Hub id, or "
                "name: and source:), found " + _type_name(agents)
            )
        check_agent_count(len(agents))
        sources, names = [], []
        for i, agent in enumerate(agents):
            at = f"agents[{i}]"
            if isinstance(agent, dict):
                _known_keys(where, at + ".", agent, AGENT_KEYS)
                if "source" not in agent:
                    raise InputError(f"{where}: {at}: needs source: (a model folder, file or Hub id)")
                sources.append(_text(where, at + ".source", agent["source"]))
                names.append(_text(where, at + ".name", agent["name"]) if agent.get("name") is not None else None)
            else:
                sources.append(_text(where, at, agent))
                names.append(None)
        method = _text(where, "method", data.get("method", defaults.METHOD))
        params = data.get("parameters")
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise InputError(f"{where}: parameters: expected a mapping of name: value, found {_type_name(params)}")
        _check_parameters(where, method, params)
        eps = data.get("eps", defaults.EPS)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)):
            raise InputError(f"{where}: eps: expected a number, found {eps!r}")
        shard_size = data.get("shard_size", defaults.SHARD_SIZE)
        if isinstance(shard_size, bool) or not isinstance(shard_size, (str, int)):
            raise InputError(f"{where}: shard_size: expected a size like 5GB, found {shard_size!r}")
        output = data.get("output")
        slices = _slices(where, method, data["slices"], len(sources)) if data.get("slices") is not None else None
        return cls(
            base=_text(where, "base", data["base"]),
            agents=sources,
            method=method,
            params=params,
            names=[str(n) for n in names] if all(names) else None,
            eps=float(eps),
            out_dtype=_text(where, "out_dtype", data.get("out_dtype", defaults.OUT_DTYPE)),
            shard_size=str(shard_size),
            device=_text(where, "device", data.get("device", defaults.DEVICE)),
            out=_text(where, "output", output) if output else None,
            vocab=_text(where, "vocab", data.get("vocab", defaults.VOCAB)),
            slices=slices,
        )


RECIPE_KEYS = (
    "format",
    "method",
    "parameters",
    "eps",
    "base",
    "agents",
    "out_dtype",
    "shard_size",
    "device",
    "output",
    "vocab",
    "slices",
)
AGENT_KEYS = ("name", "source")
SLICE_KEYS = ("sources", "parameters")
SOURCE_KEYS = ("model", "layer_range")


def layout_of(slices: list[dict[str, Any]] | None) -> Layout | None:
    """The engine's layer map of a recipe's checked ``slices`` (stacking: every slice has one source)."""
    if slices is None:
        return None
    parsed = tuple(
        Slice(tuple(SliceSource(int(x["model"]), *map(int, x["layer_range"])) for x in s["sources"])) for s in slices
    )
    stacking = all(len(s.sources) == 1 for s in parsed)
    if not stacking and any(len(s.sources) == 1 for s in parsed):
        raise InputError(
            "slices: some slices have one source (layer stacking) and others several (a merge); use one kind"
        )
    return Layout(parsed, stacking)


def _slices(where: str, method: str, value: Any, n_agents: int) -> list[dict[str, Any]]:
    """``slices``: a list of {sources: [{model: INDEX, layer_range: [START, STOP]}, ...], parameters: {...}}."""
    if not isinstance(value, list) or not value:
        raise InputError(f"{where}: slices: expected a list of slices, found {_type_name(value)}")
    out = []
    for g, item in enumerate(value):
        at = f"slices[{g}]"
        if not isinstance(item, dict):
            raise InputError(f"{where}: {at}: expected a mapping with sources:, found {_type_name(item)}")
        _known_keys(where, at + ".", item, SLICE_KEYS)
        sources = item.get("sources")
        if not isinstance(sources, list) or not sources:
            raise InputError(f"{where}: {at}.sources: expected a list of {{model: INDEX, layer_range: [START, STOP]}}")
        parsed: list[dict[str, Any]] = []
        for k, src in enumerate(sources):
            sat = f"{at}.sources[{k}]"
            if not isinstance(src, dict):
                raise InputError(f"{where}: {sat}: expected a mapping with model: and layer_range:")
            _known_keys(where, sat + ".", src, SOURCE_KEYS)
            model, layers = src.get("model"), src.get("layer_range")
            if isinstance(model, bool) or not isinstance(model, int) or not 0 <= model <= n_agents:
                raise InputError(
                    f"{where}: {sat}.model: expected a model index (0: the base, 1..{n_agents}: the agents), "
                    f"found {model!r}"
                )
            if (
                not isinstance(layers, list)
                or len(layers) != 2
                or any(isinstance(x, bool) or not isinstance(x, int) for x in layers)
                or not 0 <= layers[0] < layers[1]
            ):
                raise InputError(
                    f"{where}: {sat}.layer_range: expected [START, STOP] with 0 <= START < STOP, found {layers!r}"
                )
            parsed.append({"model": model, "layer_range": [layers[0], layers[1]]})
        lengths = sorted({b - a for a, b in (x["layer_range"] for x in parsed)})
        if len(lengths) > 1:
            raise InputError(
                f"{where}: {at}.sources: layer ranges of unequal length ({lengths}); a slice reads the same "
                "number of layers from each source"
            )
        entry: dict[str, Any] = {"sources": parsed}
        if item.get("parameters") is not None:
            params = item["parameters"]
            if not isinstance(params, dict):
                raise InputError(
                    f"{where}: {at}.parameters: expected a mapping of name: value, found {_type_name(params)}"
                )
            _check_parameters(f"{where}: {at}", method, params)
            entry["parameters"] = dict(params)
        out.append(entry)
    try:
        layout_of(out)
    except InputError as e:
        raise InputError(f"{where}: {e}") from None
    return out


def _type_name(value: Any) -> str:
    return {
        str: "text",
        int: "a number",
        float: "a number",
        bool: "true/false",
        list: "a list",
        dict: "a mapping",
        type(None): "nothing",
    }.get(type(value), type(value).__name__)


def _text(where: str, key: str, value: Any) -> str:
    """A path, name or option: text (a bare number is taken as written, e.g. a folder named 2024)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise InputError(f"{where}: {key}: expected text, found {_type_name(value)}")
    return str(value)


def _known_keys(where: str, prefix: str, data: dict, allowed: tuple[str, ...]) -> None:
    for key in data:
        if str(key) not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"; did you mean {close[0]}?" if close else f"; expected one of {', '.join(allowed)}"
            raise InputError(f"{where}: {prefix}{key}: unknown key{hint}")


def _check_parameters(where: str, method: str, params: dict) -> None:
    """Every parameter must be one of ``method``'s; one that belongs to another method is misplaced."""
    from .methods import METHODS

    if method not in METHODS:
        return  # the engine names the unknown method with the list of choices
    own = [p.name for p in METHODS[method].params]
    for key in params:
        if str(key) in own:
            continue
        owners = [name for name, m in METHODS.items() if any(p.name == str(key) for p in m.params)]
        if owners:
            raise InputError(
                f"{where}: parameters.{key}: a parameter of {', '.join(owners)}, not of {method} "
                f"(which takes {', '.join(own) or 'none'})"
            )
        close = difflib.get_close_matches(str(key), own, n=1)
        hint = f"; did you mean {close[0]}?" if close else f"; {method} takes {', '.join(own) or 'none'}"
        raise InputError(f"{where}: parameters.{key}: unknown parameter{hint}")
