"""Per-tensor parameter values in mergekit 0.1.5's parameter model (docs/methods.md, "Parameter values").

A parameter value (a *setting*) is one of

* a number (or true/false): the same value for every tensor;
* a gradient, a list of numbers ``[v_0, …, v_{m−1}]``: interpolated over the layers. A tensor of decoder
  layer ``i`` of ``L`` has the position ``t = i / (L − 1)`` (``t = 1`` when ``L = 1``); every other
  tensor (embeddings, final norm, head) has ``t = 0``. With ``s = t·(m − 1)``, ``i0 = ⌊s⌋``,
  ``i1 = min(m − 1, i0 + 1)`` and ``f = s − i0`` the value is ``(1 − f)·v_i0 + f·v_i1`` in double
  precision (a list of true/false values picks ``v_⌊t·(m−1)⌋``);
* filters, a list of ``{filter: TEXT, value: SETTING}`` (or one such mapping): the first entry whose
  ``filter`` is a substring of the tensor's name (or is missing or ``*``: the fallback) gives the value,
  itself a number or a gradient; when none matches the parameter falls back to the next source (a
  model's own parameters, then the merge's shared ``parameters``) and finally to its default.

These are the rules of mergekit 0.1.5 (``config.evaluate_setting``, ``parameter_resolver``,
``plan.MergePlanner.plan_slice``), written anew here; a method resolves its parameters per tensor with
``resolve`` and ``layer_position`` and never reads tensor names for anything else.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..errors import InputError, ParameterError

LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")

NOT_SET = object()  # a setting that gives no value for this tensor (no filter matched)


def layer_index(name: str) -> int | None:
    """The decoder layer a tensor belongs to (``…layers.<i>.…``), or None."""
    m = LAYER.search(name)
    return int(m.group(1)) if m else None


def count_layers(names: Iterable[str]) -> int:
    """Decoder layers in a model: one more than the highest layer index among its tensor names (0: none)."""
    return max((i + 1 for i in map(layer_index, names) if i is not None), default=0)


def layer_position(name: str, n_layers: int) -> float:
    """mergekit's ``t`` of a tensor: i / (L − 1) in layer i of L (1 when L = 1); 0 outside the layers."""
    i = layer_index(name)
    if i is None or n_layers <= 0:
        return 0.0
    return i / (n_layers - 1) if n_layers > 1 else 1.0


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (bool, int, float, str))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def evaluate(setting: Any, name: str, t: float, validate: Callable[[Any], Any]) -> Any:
    """The value of ``setting`` for tensor ``name`` at layer position ``t`` (``NOT_SET`` when no filter matches)."""
    if isinstance(setting, dict):
        setting = [setting]
    if _is_scalar(setting):
        return validate(setting)
    if isinstance(setting, list):
        if not setting:
            return NOT_SET
        if all(_is_scalar(e) for e in setting):
            values = [validate(e) for e in setting]
            if not all(_is_number(v) for v in values):
                return values[int(t * (len(values) - 1))]
            scaled = t * (len(values) - 1)
            i0 = int(scaled)
            i1 = min(len(values) - 1, i0 + 1)
            frac = scaled - i0
            return validate((1 - frac) * values[i0] + frac * values[i1])
        for cond in setting:
            filt = cond.get("filter")
            if filt is None or filt == "*" or (name and filt in name):
                return evaluate(cond["value"], name, t, validate)
        return NOT_SET
    raise InputError(f"cannot read parameter value {setting!r}")


def resolve(sources: Sequence[Any], name: str, t: float, validate: Callable[[Any], Any], default: Any) -> Any:
    """The first source (highest precedence first; None: not given there) that gives a value, else ``default``."""
    for setting in sources:
        if setting is None:
            continue
        value = evaluate(setting, name, t, validate)
        if value is not NOT_SET:
            return value
    return default


def setting_value(setting: Any, name: str, n_layers: int, default: Any = None) -> Any:
    """The value a checked ``setting`` (``check_setting``) gives tensor ``name`` of a model with ``n_layers``
    decoder layers, as a method's merge reads it (``resolve`` at ``layer_position``); ``default`` when no
    filter matches. The window's filters editor shows it for common tensor names."""
    return resolve([setting], name, layer_position(name, n_layers), lambda v: v, default)


def check_setting(where: str, value: Any, validate: Callable[[Any], Any]) -> Any:
    """A setting's shape checked (numbers, a gradient list, filters with ``filter``/``value``), every number
    validated; returned in its plain form (filters as a list of ``{"filter", "value"}`` mappings)."""
    if isinstance(value, dict):
        value = [value]
    if _is_scalar(value):
        return validate(value)
    if isinstance(value, (list, tuple)):
        if not value:
            raise _refused(
                where,
                ": an empty list gives no value; write a number, a list of numbers (a gradient over the layers) "
                "or filters",
                value,
            )
        if all(_is_scalar(e) for e in value):
            return [validate(e) for e in value]
        out = []
        for i, cond in enumerate(value):
            if not isinstance(cond, dict) or "value" not in cond:
                raise _refused(where, f"[{i}]: a filtered value needs value: (and optionally filter: TEXT)", value)
            extra = sorted(set(map(str, cond)) - {"filter", "value"})
            if extra:
                raise _refused(where, f"[{i}].{extra[0]}: unknown key; a filtered value has filter: and value:", value)
            filt = cond.get("filter")
            if filt is not None and not isinstance(filt, str):
                raise _refused(where, f"[{i}].filter: expected text, found {filt!r}", filt)
            inner = cond["value"]
            if isinstance(inner, dict) or (isinstance(inner, list) and not all(_is_scalar(e) for e in inner)):
                raise _refused(where, f"[{i}].value: a filtered value is a number or a list of numbers", inner)
            try:
                entry: dict[str, Any] = {"value": check_setting(f"{where}[{i}].value", inner, validate)}
            except ParameterError as e:
                if not e.reason.startswith(("[", ":")):
                    raise
                raise ParameterError(str(e), e.parameter, e.value, f"[{i}].value{e.reason}", e.agent) from None
            if filt is not None:
                entry = {"filter": filt, **entry}
            out.append(entry)
        return out
    raise _refused(where, f": expected a number, a list of numbers (a gradient) or filters, found {value!r}", value)


def _refused(where: str, reason: str, value: Any) -> ParameterError:
    """A setting's shape refused: the message says ``where`` (the flag, or the recipe's place) then ``reason``
    (where in the setting, then why), which a face puts after its own name for the parameter."""
    return ParameterError(f"{where}{reason}", value=value, reason=reason)


def is_plain(value: Any) -> bool:
    """A single value (no gradient, no filters)."""
    return _is_scalar(value)


def finite_float(value: Any) -> float:
    """mergekit's float parameters accept numbers and numeric text; ours must be finite too."""
    if isinstance(value, bool):
        raise InputError(f"expected a number, found {value!r}")
    out = float(value)
    if not math.isfinite(out):
        raise InputError(f"expected a finite number, found {value!r}")
    return out
