"""The checks of a recipe file's parts (keys, text values, parameters, the layer map ``slices``) and sizes;
``spec.MergeSpec`` reads and writes the file (``ram-recipe.yaml``) with them."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .engine.plan import Layout, Slice, SliceSource
from .errors import InputError

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
    "tokenizer",
    "chat_template",
    "slices",
)
AGENT_KEYS = ("name", "source")
SLICE_KEYS = ("sources", "parameters")
SOURCE_KEYS = ("model", "layer_range")


def layout_of(slices: Sequence[Mapping[str, Any]] | None) -> Layout | None:
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


def read_slices(where: str, method: str, value: Any, n_agents: int) -> list[dict[str, Any]]:
    """``slices``: a list of {sources: [{model: INDEX, layer_range: [START, STOP]}, ...], parameters: {...}}."""
    if not isinstance(value, list) or not value:
        raise InputError(f"{where}: slices: expected a list of slices, found {type_name(value)}")
    out = []
    for g, item in enumerate(value):
        at = f"slices[{g}]"
        if not isinstance(item, dict):
            raise InputError(f"{where}: {at}: expected a mapping with sources:, found {type_name(item)}")
        known_keys(where, at + ".", item, SLICE_KEYS)
        sources = item.get("sources")
        if not isinstance(sources, list) or not sources:
            raise InputError(f"{where}: {at}.sources: expected a list of {{model: INDEX, layer_range: [START, STOP]}}")
        parsed: list[dict[str, Any]] = []
        for k, src in enumerate(sources):
            sat = f"{at}.sources[{k}]"
            if not isinstance(src, dict):
                raise InputError(f"{where}: {sat}: expected a mapping with model: and layer_range:")
            known_keys(where, sat + ".", src, SOURCE_KEYS)
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
                    f"{where}: {at}.parameters: expected a mapping of name: value, found {type_name(params)}"
                )
            check_parameters(f"{where}: {at}", method, params)
            entry["parameters"] = dict(params)
        out.append(entry)
    try:
        layout_of(out)
    except InputError as e:
        raise InputError(f"{where}: {e}") from None
    return out


def type_name(value: Any) -> str:
    return {
        str: "text",
        int: "a number",
        float: "a number",
        bool: "true/false",
        list: "a list",
        dict: "a mapping",
        type(None): "nothing",
    }.get(type(value), type(value).__name__)


def text_value(where: str, key: str, value: Any) -> str:
    """A path, name or option: text (a bare number is taken as written, e.g. a folder named 2024)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise InputError(f"{where}: {key}: expected text, found {type_name(value)}")
    return str(value)


def known_keys(where: str, prefix: str, data: dict, allowed: tuple[str, ...]) -> None:
    for key in data:
        if str(key) not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"; did you mean {close[0]}?" if close else f"; expected one of {', '.join(allowed)}"
            raise InputError(f"{where}: {prefix}{key}: unknown key{hint}")


def check_parameters(where: str, method: str, params: dict) -> None:
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
