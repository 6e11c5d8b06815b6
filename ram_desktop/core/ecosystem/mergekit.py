"""mergekit merge configurations in and out.

``from_mergekit`` turns a mergekit YAML (``merge_method``, ``base_model``, ``models``, ``parameters``,
``dtype``, ``out_dtype``) into a ``MergeSpec`` when RAM Desktop has the method, and refuses, naming the
key, whatever it cannot express: slices, modules, per-layer value lists (gradients), filtered
parameters, LoRA applied to anything but the base, unequal per-model weights or densities, and
switches that change the arithmetic (``normalize``, ``rescale``) where ours has no equivalent. A LoRA applied
to the base (``BASE+ADAPTER``) is an agent, as the adapter named as one.
Differences that remain (TIES's cut, DARE's mask and rescale, RAM+'s per-tensor ρ, compute dtype)
come back as warnings.

``to_mergekit`` writes the closest mergekit YAML for a recipe, with a YAML comment on every
difference. Semantics follow mergekit 0.1.5 (``merge_methods/generalized_task_arithmetic.py``,
``merge_methods/ram.py``, ``sparsify.py``, ``config.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from ..errors import InputError
from ..frozen import thaw
from ..methods import METHODS, get_method
from ..methods.mergekit_map import MergekitExact, MergekitImport, MergekitInput
from ..recipe import RECIPE_KEYS, known_keys
from ..sources import HUB_ID, open_checkpoint, split_applied
from ..spec import FORMAT, MergeSpec, make_agents
from ..storage.formats.lora import bind_all, is_adapter_folder
from ..storage.safe_read import read_yaml
from ..tokenizer import read_chat_template, read_tokenizer, read_tokenizer_source


def _imports() -> dict[str, MergekitImport]:
    """Every mergekit ``merge_method`` a registered method reads (``Interop.mergekit``), by mergekit's name."""
    return {
        imp.name: imp for m in METHODS.values() if m.interop.mergekit is not None for imp in m.interop.mergekit.imports
    }


def _exact() -> dict[str, tuple[str, MergekitExact]]:
    """Every mergekit ``merge_method`` a registered method computes with mergekit's semantics: (our method, mapping)."""
    return {
        ex.name: (name, ex)
        for name, m in METHODS.items()
        if m.interop.mergekit is not None
        for ex in m.interop.mergekit.exact
    }


TOP_LEVEL = {
    "merge_method",
    "base_model",
    "models",
    "slices",
    "parameters",
    "dtype",
    "out_dtype",
    "tokenizer_source",
    "tokenizer",
    "chat_template",
}
REFUSED_TOP_LEVEL = {
    "modules": "per-module definitions (RAM Desktop merges whole models with one base)",
}
DTYPES = {
    "float64": "float64",
    "fp64": "float64",
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
}


@dataclass
class Imported:
    """A mergekit configuration as a merge spec, with what differs from mergekit's run of the same file."""

    spec: MergeSpec
    warnings: list[str] = field(default_factory=list)


MERGEKIT_KEYS = TOP_LEVEL | set(REFUSED_TOP_LEVEL)  # every top-level key of mergekit 0.1.5's configuration
_THEIRS = MERGEKIT_KEYS - set(RECIPE_KEYS)  # merge_method, models, base_model, dtype, ...: mergekit's alone
_OURS = set(RECIPE_KEYS) - MERGEKIT_KEYS  # method, base, agents, ...: a recipe's alone


def is_mergekit(data: Any) -> bool:
    """A mapping without our ``format`` key that has a key of mergekit's own (``merge_method``, ``models``,
    ``base_model`` ...), or only keys both share (``slices``, ``parameters`` ...) beside unknown ones: a mergekit
    configuration, also when its ``merge_method`` is misspelt (``from_mergekit`` then names the key)."""
    if not isinstance(data, dict) or "format" in data:
        return False
    keys = {str(k) for k in data}
    return bool(keys & _THEIRS) or bool(keys & MERGEKIT_KEYS and not keys & _OURS)


def is_mergekit_file(path: Path) -> bool:
    """``path`` reads as a mergekit configuration (``is_mergekit``); False for a file that does not read."""
    try:
        return is_mergekit(_read_yaml(Path(path)))
    except InputError:
        return False


def load_recipe_or_mergekit(path: Path) -> Imported:
    """``ram-merge run``'s reader: a RAM Desktop recipe, or a mergekit configuration converted."""
    data = _read_yaml(Path(path))
    if is_mergekit(data):
        return from_mergekit(data, str(path))
    return Imported(MergeSpec.from_dict(data, str(path)))


def load_mergekit(path: Path) -> Imported:
    data = _read_yaml(Path(path))
    if not is_mergekit(data):
        raise InputError(f"{path}: not a mergekit configuration (none of mergekit's keys: merge_method, models ...)")
    return from_mergekit(data, str(path))


def _read_yaml(path: Path) -> Any:
    return read_yaml(path)


def _scalar(where: str, key: str, value: Any) -> Any:
    """A plain value; gradients (lists) and filtered values (mappings) are refused."""
    if isinstance(value, list):
        raise InputError(
            f"{where}: {key} is a per-layer value list (gradient); RAM Desktop uses one value "
            "for the whole model, write a single number"
        )
    if isinstance(value, dict):
        raise InputError(
            f"{where}: {key} has filtered values (filter/value); RAM Desktop uses one value "
            "for every tensor, write a single number"
        )
    return value


def _number(where: str, key: str, value: Any) -> float:
    value = _scalar(where, key, value)
    if isinstance(value, bool):
        raise InputError(f"{where}: {key} must be a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InputError(f"{where}: {key} must be a number, got {value!r}") from None


def _flag(where: str, key: str, value: Any) -> bool:
    value = _scalar(where, key, value)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in {"true", "false"}:
        return value.strip().lower() == "true"
    raise InputError(f"{where}: {key} must be true or false, got {value!r}")


def _path_text(where: str, key: str, ref: Any) -> str:
    """One of mergekit's ``ModelPath``s (a text, or ``path`` with an optional ``revision``) as our source text."""
    if isinstance(ref, dict):
        path, revision = ref.get("path"), ref.get("revision")
        if not isinstance(path, str) or not path.strip():
            raise InputError(f"{where}: {key} names no model path")
        return f"{path.strip()}@{revision}" if revision else path.strip()
    if not isinstance(ref, str) or not ref.strip():
        raise InputError(f"{where}: {key} must name a model (a folder or org/name)")
    return ref.strip()


def _model_ref(where: str, key: str, ref: Any) -> str:
    """mergekit's ``model`` value as our source text (``path``, ``org/name`` or ``org/name@revision``; a LoRA
    applied to a model, ``MODEL+ADAPTER`` or ``{model: ..., lora: ...}``, as ``MODEL+ADAPTER``)."""
    if isinstance(ref, dict):
        inner = ref.get("model", ref)
        text = _path_text(where, key, inner)
        if ref.get("lora"):
            text = f"{text}+{_path_text(where, key + '.lora', ref['lora'])}"
    else:
        text = _path_text(where, key, ref)
    try:
        split_applied(text)  # one '+' between two names
    except InputError as e:
        raise InputError(f"{where}: {key}: {e}") from None
    return text


def _check_applied(where: str, key: str, source: str, base: str) -> None:
    """A ``MODEL+ADAPTER`` model: MODEL must be the merge's base, and the adapter must fit it (local sources
    are opened and bound now, headers only, so a wrong adapter is refused naming the key before anything
    runs; a Hub source is checked when it is downloaded)."""
    applied = split_applied(source)
    if applied is None:
        return
    model, adapter = applied
    if not _same_source(model, base):
        raise InputError(
            f"{where}: {key}: {source} applies a LoRA to {model}, but the merge's base is {base}; RAM Desktop "
            "applies an adapter to the base only (write BASE+ADAPTER)"
        )
    if any(HUB_ID.match(p) and not Path(p).expanduser().exists() for p in (model, adapter)):
        return
    try:
        bind_all(open_checkpoint(base), [open_checkpoint(source)])
    except InputError as e:
        raise InputError(f"{where}: {key}: {e}") from None


def _same_source(a: str, b: str) -> bool:
    if a.strip() == b.strip():
        return True
    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    try:
        return pa.exists() and pb.exists() and pa.resolve() == pb.resolve()
    except OSError:
        return False


def _whole_model(where: str, key: str, source: str) -> str:
    """A source that must be a full model (a base, a slice's layers): ``MODEL+ADAPTER`` is refused there."""
    if split_applied(source) is not None:
        raise InputError(
            f"{where}: {key}: {source} applies a LoRA; RAM Desktop applies an adapter to a merged model of "
            "models: only, never to the base or a slice's layers (merge the adapter into its model first)"
        )
    return source


def _dtype(where: str, key: str, value: Any) -> str:
    text = str(_scalar(where, key, value)).strip().lower()
    if text not in DTYPES:
        raise InputError(f"{where}: {key} = {value!r} is not one of {', '.join(sorted(set(DTYPES.values())))}")
    return DTYPES[text]


def from_mergekit(data: Any, where: str = "mergekit config") -> Imported:
    """Convert a parsed mergekit configuration; ``InputError`` naming the key when it cannot be expressed."""
    if not isinstance(data, dict):
        raise InputError(f"{where}: not a mergekit configuration (a mapping with merge_method)")
    for key, why in REFUSED_TOP_LEVEL.items():
        if data.get(key) is not None:
            raise InputError(f"{where}: {key}: {why} cannot be expressed in RAM Desktop")
    known_keys(where, "", data, tuple(sorted(MERGEKIT_KEYS)))  # a typo is named with the key it is close to
    if data.get("merge_method") is None:
        raise InputError(f"{where}: merge_method: missing; name mergekit's merge method (e.g. ties, slerp, linear)")
    settings, template = _tokenizer_settings(data, where)  # checked before the models, like every key
    imported = _convert(data, where)
    if data.get("tokenizer") is not None and data.get("tokenizer_source") is not None:
        imported.warnings.append("tokenizer_source is ignored where a tokenizer block is given (as in mergekit)")
    return _with_tokenizer(imported, settings, template, where, data.get("tokenizer") is not None)


def _tokenizer_settings(data: dict, where: str) -> tuple[dict[str, Any] | None, str | None]:
    """mergekit's ``tokenizer`` block (which overrides ``tokenizer_source``; its source defaults to union) or
    ``tokenizer_source``, and ``chat_template``, checked."""
    block, source = data.get("tokenizer"), data.get("tokenizer_source")
    if block is not None:
        settings = read_tokenizer(where, block)
    elif source is not None:
        settings = {"source": read_tokenizer_source(f"{where}: tokenizer_source", source)}
    else:
        settings = None
    return settings, read_chat_template(f"{where}: chat_template", data.get("chat_template"))


def _with_tokenizer(
    imported: Imported, settings: dict[str, Any] | None, template: str | None, where: str, block: bool
) -> Imported:
    """The tokenizer settings on the spec, each model path named as the spec names it (base, an agent's name);
    ``InputError`` naming the key for a model that is not in the merge."""
    spec = imported.spec
    key = "tokenizer.source" if block else "tokenizer_source"

    def named(at: str, ref: str) -> str:
        ref = _model_ref(where, at, ref)
        if ref == spec.base:
            return "base"
        if ref in spec.sources:
            return spec.names[spec.sources.index(ref)]
        raise InputError(
            f"{where}: {at}: {ref!r} is not a model of this merge (the base or one of models); "
            "name one of them, or use base or union"
        )

    if settings is not None:
        if settings["source"].startswith("model:"):
            settings["source"] = "model:" + named(key, settings["source"].removeprefix("model:"))
        for token, rule in settings.get("tokens", {}).items():
            at = f"tokenizer.tokens.{token}.source"
            if isinstance(rule.get("source"), str):
                rule["source"] = named(at, rule["source"])
            elif isinstance(rule.get("source"), dict) and "model" in rule["source"]:
                rule["source"]["model"] = named(at + ".model", rule["source"]["model"])
    imported.spec = spec.replace(tokenizer=settings, chat_template=template)
    return imported


def _convert(data: dict, where: str) -> Imported:
    method = str(data.get("merge_method"))
    imports = _imports()
    exact = _exact()
    if data.get("slices") is not None:
        return _from_slices(data, where, method, exact)
    if method in exact and get_method(exact[method][0]).streaming.stacks:
        raise InputError(
            f"{where}: merge_method: {method} copies layers of the models named in slices; write slices "
            "(each with one source: model and layer_range)"
        )
    if method not in imports and method not in exact:
        raise InputError(
            f"{where}: merge_method: {method!r} has no RAM Desktop equivalent; supported: "
            f"{', '.join(sorted(set(imports) | set(exact)))}"
        )
    if method not in imports:
        return _from_exact(data, where, *exact[method])
    if method in exact and (data.get("tokenizer") is not None or data.get("tokenizer_source") is not None):
        return _from_exact(data, where, *exact[method])  # re-indexed rows are averaged in mergekit's dtype
    try:
        classic = _from_classic(data, where, method, imports[method])
    except InputError:
        if method not in exact:
            raise
        return _from_exact(data, where, *exact[method])
    if classic.warnings and method in exact:  # the paper method differs from mergekit's: take mergekit's
        return _from_exact(data, where, *exact[method])
    return classic


def _combine(own: Any, shared: Any) -> Any:
    """A model's setting with the merge's shared one as its fallback (mergekit's precedence): filters that may
    match nothing get the shared setting appended as further filters."""
    if own is None:
        return shared
    if shared is None or not isinstance(own, (list, dict)):
        return own
    filters = [own] if isinstance(own, dict) else own
    if not all(isinstance(f, dict) for f in filters):
        return own  # a gradient: always a value
    tail = (
        shared
        if isinstance(shared, list) and all(isinstance(f, dict) for f in shared)
        else ([shared] if isinstance(shared, dict) else [{"value": shared}])
    )
    return [*filters, *tail]


def _from_exact(data: dict, where: str, ours: str, exact: MergekitExact) -> Imported:
    """A configuration read with mergekit's semantics: every parameter shape (gradients, filters, per-model
    values with the shared ones as fallback), the base among the models, mergekit's compute dtype."""
    method = get_method(ours)
    known = {p.name: p for p in method.params}
    models = data.get("models")
    if not isinstance(models, list) or not models:
        raise InputError(f"{where}: models: needs a list of models to merge")
    base = (
        _whole_model(where, "base_model", _model_ref(where, "base_model", data["base_model"]))
        if data.get("base_model")
        else None
    )
    given = data.get("parameters") or {}
    if not isinstance(given, dict):
        raise InputError(f"{where}: parameters must be a mapping")
    per_model_keys = set(exact.per_model)
    for key in given:
        if key not in exact.shared and key not in per_model_keys:
            raise InputError(
                f"{where}: parameters.{key}: not a parameter of mergekit's {exact.name} (it takes "
                f"{', '.join([*exact.shared, *exact.per_model]) or 'none'})"
            )

    entries: list[tuple[str, dict, str]] = []
    for i, entry in enumerate(models):
        at = f"models[{i}]"
        if not isinstance(entry, dict) or "model" not in entry:
            raise InputError(f"{where}: {at}: needs model: PATH")
        extra = sorted(set(entry) - {"model", "parameters"})
        if extra:
            raise InputError(f"{where}: {at}.{extra[0]}: unknown key, RAM Desktop cannot express it")
        params = entry.get("parameters") or {}
        if not isinstance(params, dict):
            raise InputError(f"{where}: {at}.parameters must be a mapping")
        for key in params:
            if key not in per_model_keys:
                raise InputError(
                    f"{where}: {at}.parameters.{key}: not a per-model parameter of mergekit's "
                    f"{exact.name} (per model it takes {', '.join(exact.per_model) or 'none'})"
                )
        entries.append((_model_ref(where, f"{at}.model", entry["model"]), params, f"{at}.parameters"))

    params_out: dict[str, Any] = {}
    # without base_model, the first model lays out the merge (its adapter, if any, stays an input)
    first = (split_applied(entries[0][0]) or (entries[0][0],))[0]
    if exact.base == "input":  # every model is an input, the base appended last when given and not listed
        if base is not None and base not in [s for s, _, _ in entries]:
            entries.append((base, {}, "parameters"))
        recipe_base, agents = base or first, entries
    elif exact.base == "optional" and base is None:
        recipe_base, agents = first, entries
        params_out["use_base"] = False
    else:
        if base is None:
            raise InputError(f"{where}: base_model: mergekit's {exact.name} needs a base model; add base_model")
        recipe_base, agents = base, [e for e in entries if e[0] != base]
        for source, p, at in entries:
            if source == base and p:
                raise InputError(
                    f"{where}: {at}: the base's own parameters are not used by mergekit's {exact.name} "
                    "(they apply to the other models only); remove them"
                )
    for source, _, at in agents:
        _check_applied(where, at.removesuffix(".parameters") + ".model", source, recipe_base)
    low, high = exact.agents
    if not low <= len(agents) <= (high if high is not None else len(agents)):
        want = f"exactly {low}" if low == high else f"at least {low}"
        raise InputError(
            f"{where}: models: mergekit's {exact.name} merges {want} model(s) besides the base; found {len(agents)}"
        )

    for theirs, ours_key in exact.shared.items():
        if theirs in given:
            params_out[ours_key] = _setting(where, f"parameters.{theirs}", given[theirs], known[ours_key])
    by_model: list[dict[str, Any]] = [{} for _ in agents]  # each model's parameters, onto its agent
    for theirs, ours_key in exact.per_model.items():
        shared = _setting(where, f"parameters.{theirs}", given[theirs], known[ours_key]) if theirs in given else None
        values = []
        for _, p, at in agents:
            own = _setting(where, f"{at}.{theirs}", p[theirs], known[ours_key]) if theirs in p else None
            value = _combine(own, shared)
            if value is None and theirs in exact.required:
                raise InputError(
                    f"{where}: {at}.{theirs}: mergekit's {exact.name} requires a {theirs} for every "
                    f"model; add one (or parameters.{theirs} for all)"
                )
            values.append(value)
        if any(v is not None for v in values):
            params_out[ours_key] = values
            for agent_values, value in zip(by_model, values):
                agent_values[ours_key] = value
    compute = _dtype(where, "dtype", data["dtype"]) if data.get("dtype") is not None else None
    if "dtype" in known:
        params_out["dtype"] = compute or "inputs"
    out_dtype = (
        _dtype(where, "out_dtype", data["out_dtype"]) if data.get("out_dtype") is not None else compute or "base"
    )
    try:
        method.resolve(params_out)
    except InputError as e:
        raise InputError(f"{where}: {e}") from None
    made = make_agents([s for s, _, _ in agents])
    spec = MergeSpec(
        base=recipe_base,
        agents=tuple(replace(a, params=values) for a, values in zip(made, by_model)),
        method=ours,
        params={k: v for k, v in params_out.items() if not any(k in values for values in by_model)},
        out_dtype=out_dtype,
    )
    warnings = []
    if any(s == recipe_base for s, _, _ in agents):
        warnings.append(f"{exact.name}: the base model {recipe_base} is one of the merged inputs (as in mergekit)")
    return Imported(spec, warnings)


SLICE_KEYS = {"sources", "base_model", "parameters"}
SOURCE_KEYS = {"model", "layer_range", "parameters"}


def _slice_list(data: dict, where: str) -> list[tuple[str, dict, list[tuple[str, tuple[int, int], dict]]]]:
    """mergekit's ``slices`` checked: per slice (its YAML path, its parameters, its sources as
    (model, layer range, parameters)); ``InputError`` naming the key otherwise."""
    if data.get("models") is not None:
        raise InputError(f"{where}: models: give either models or slices, not both (as in mergekit)")
    slices = data["slices"]
    if not isinstance(slices, list) or not slices:
        raise InputError(f"{where}: slices: expected a list of slices, each with sources:")
    out = []
    for g, sl in enumerate(slices):
        at = f"slices[{g}]"
        if not isinstance(sl, dict) or not isinstance(sl.get("sources"), list) or not sl["sources"]:
            raise InputError(f"{where}: {at}.sources: expected a list of sources (model: and layer_range:)")
        extra = sorted(set(sl) - SLICE_KEYS)
        if extra:
            raise InputError(f"{where}: {at}.{extra[0]}: cannot be expressed in RAM Desktop")
        params = sl.get("parameters") or {}
        if not isinstance(params, dict):
            raise InputError(f"{where}: {at}.parameters must be a mapping")
        sources = []
        for k, src in enumerate(sl["sources"]):
            sat = f"{at}.sources[{k}]"
            if not isinstance(src, dict) or "model" not in src:
                raise InputError(f"{where}: {sat}: needs model: PATH and layer_range: [START, STOP]")
            extra = sorted(set(src) - SOURCE_KEYS)
            if extra:
                raise InputError(f"{where}: {sat}.{extra[0]}: unknown key, RAM Desktop cannot express it")
            layers = src.get("layer_range")
            if (
                not isinstance(layers, list)
                or len(layers) != 2
                or any(isinstance(x, bool) or not isinstance(x, int) for x in layers)
                or not 0 <= layers[0] < layers[1]
            ):
                raise InputError(f"{where}: {sat}.layer_range: expected [START, STOP] with 0 <= START < STOP")
            sparams = src.get("parameters") or {}
            if not isinstance(sparams, dict):
                raise InputError(f"{where}: {sat}.parameters must be a mapping")
            model = _whole_model(where, f"{sat}.model", _model_ref(where, f"{sat}.model", src["model"]))
            sources.append((model, (layers[0], layers[1]), sparams))
        lengths = {b - a for _, (a, b), _ in sources}
        if len(lengths) > 1:
            raise InputError(
                f"{where}: {at}.sources: layer ranges of unequal length ({sorted(lengths)}); mergekit and RAM "
                "Desktop read the same number of layers from each source of a slice"
            )
        names = [m for m, _, _ in sources]
        if len(set(names)) != len(names):
            raise InputError(f"{where}: {at}.sources: a model is listed twice in one slice; it cannot be expressed")
        out.append((at, params, sources))
    return out


def _from_slices(data: dict, where: str, method: str, exact: dict[str, tuple[str, MergekitExact]]) -> Imported:
    """mergekit's ``slices``: a stacking (passthrough, one source per slice) or a merge of the same models in every
    slice (mergekit's semantics, one recipe slice per mergekit slice). Parameters: a source's, then its
    slice's, then the merge's (mergekit's ``ConfigReader``)."""
    slices = _slice_list(data, where)
    if method in exact and get_method(exact[method][0]).streaming.stacks:
        return _from_stacking(data, where, slices, exact[method][0])
    if method not in exact:
        raise InputError(
            f"{where}: slices: merge_method {method!r} is read with slices only where RAM Desktop computes "
            f"mergekit's own method ({', '.join(sorted(exact))}, passthrough)"
        )
    ours, ex = exact[method]
    shared = data.get("parameters") or {}
    if not isinstance(shared, dict):
        raise InputError(f"{where}: parameters must be a mapping")
    recipes: list[MergeSpec] = []
    warnings: list[str] = []
    for at, sparams, sources in slices:
        base_ref = data["slices"][int(at[7:-1])].get("base_model") or data.get("base_model")
        merged = {k: _combine(sparams.get(k), shared.get(k)) for k in {*sparams, *shared}}
        one = {key: data[key] for key in ("merge_method", "dtype", "out_dtype") if data.get(key) is not None}
        if base_ref:
            one["base_model"] = base_ref
            base = _model_ref(where, f"{at}.base_model", base_ref)
            if ex.base == "input" and base not in [m for m, _, _ in sources]:
                raise InputError(
                    f"{where}: {at}.base_model: {base} is not among the slice's sources; name its layer_range there"
                )
        one["models"] = [{"model": m, **({"parameters": p} if p else {})} for m, _, p in sources]
        if merged:
            one["parameters"] = merged
        imported = _from_exact(one, f"{where}: {at}", ours, ex)
        recipes.append(imported.spec)
        warnings += [w for w in imported.warnings if w not in warnings]
        ranges = {m: r for m, r, _ in sources}
        if imported.spec.base not in ranges:
            raise InputError(
                f"{where}: {at}.sources: the base model {imported.spec.base} is not among the slice's sources; "
                "mergekit reads its layers from there (add it with its layer_range)"
            )
    first = recipes[0]
    layout: list[dict[str, Any]] = []
    slice_params: list[dict[str, Any] | None] = []
    for (at, _, sources), recipe in zip(slices, recipes):
        if recipe.base != first.base or sorted(recipe.sources) != sorted(first.sources):
            raise InputError(
                f"{where}: {at}.sources: merges other models than slices[0] ({', '.join(recipe.sources)}); RAM "
                "Desktop merges the same models in every slice"
            )
        order = [recipe.sources.index(a) for a in first.sources]
        params = {
            k: [v[i] for i in order] if isinstance(v, list) and _per_agent(ours, k) else v
            for k, v in recipe.engine_params().items()
        }
        ranges = {m: r for m, r, _ in sources}
        roles = [first.base, *first.sources]
        layout.append({"sources": [{"model": i, "layer_range": list(ranges[m])} for i, m in enumerate(roles)]})
        slice_params.append(params)
    first_params = first.engine_params()
    for entry, own in zip(layout, slice_params):
        if own != first_params:
            entry["parameters"] = own
    spec = MergeSpec.build(
        first.base, first.sources, method=ours, params=first_params, out_dtype=first.out_dtype, slices=layout
    )
    return Imported(spec, warnings)


def _per_agent(method: str, key: str) -> bool:
    return any(p.name == key and p.per_agent for p in get_method(method).params)


def _from_stacking(data: dict, where: str, slices: list, ours: str) -> Imported:
    """passthrough over slices: each slice one model's layer range, stacked in order; ``scale`` per model."""
    method = get_method(ours)
    scale_param = next(p for p in method.params if p.name == "scale")
    shared = data.get("parameters") or {}
    if not isinstance(shared, dict):
        raise InputError(f"{where}: parameters must be a mapping")
    for key in shared:
        if key != "scale":
            raise InputError(f"{where}: parameters.{key}: not a parameter of mergekit's passthrough (it takes scale)")
    models: list[str] = []
    for at, sparams, sources in slices:
        if len(sources) != 1:
            raise InputError(
                f"{where}: {at}.sources: passthrough copies one model's layers per slice; found {len(sources)} sources"
            )
        for key in sparams:
            if key != "scale":
                raise InputError(f"{where}: {at}.parameters.{key}: not a parameter of mergekit's passthrough")
        model, _, own = sources[0]
        for key in own:
            if key != "scale":
                raise InputError(
                    f"{where}: {at}.sources[0].parameters.{key}: not a parameter of mergekit's passthrough"
                )
        if model not in models:
            models.append(model)
    base = (
        _whole_model(where, "base_model", _model_ref(where, "base_model", data["base_model"]))
        if data.get("base_model")
        else slices[0][2][0][0]
    )
    compute = _dtype(where, "dtype", data["dtype"]) if data.get("dtype") is not None else None
    out_dtype = (
        _dtype(where, "out_dtype", data["out_dtype"]) if data.get("out_dtype") is not None else compute or "base"
    )
    layout: list[dict[str, Any]] = []
    per_slice: list[dict[str, Any]] = []
    for at, sparams, sources in slices:
        model, (start, stop), own = sources[0]
        index = models.index(model)
        value = _combine(own.get("scale"), _combine(sparams.get("scale"), shared.get("scale")))
        scales: list[Any] = [None] * len(models)
        if value is not None:
            scales[index] = _setting(where, f"{at}.sources[0].parameters.scale", value, scale_param)
        params: dict[str, Any] = {"dtype": compute or "inputs"}
        if any(v is not None for v in scales):
            params["scale"] = scales
        layout.append({"sources": [{"model": index + 1, "layer_range": [start, stop]}]})
        per_slice.append(params)
    first = per_slice[0]
    for entry, params in zip(layout, per_slice):
        if params != first:
            entry["parameters"] = params
    return Imported(MergeSpec.build(base, models, method=ours, params=dict(first), out_dtype=out_dtype, slices=layout))


def _setting(where: str, key: str, value: Any, param: Any) -> Any:
    """One mergekit value as our parameter's setting: checked (numbers, gradients, filters), naming the key."""
    from ..methods.settings import check_setting

    if param.kind is bool:
        return _flag(where, key, value)
    try:
        return (
            check_setting(f"{where}: {key}", value, param._validate_one)
            if param.setting
            else param._validate_one(_scalar(where, key, value))
        )
    except InputError as e:
        raise InputError(str(e) if str(e).startswith(where) else f"{where}: {key}: {e}") from None


def _from_classic(data: dict, where: str, method: str, mapping: MergekitImport) -> Imported:
    """The classic import: one value per parameter, the base apart from the models, our paper methods."""
    if not data.get("base_model"):
        raise InputError(
            f"{where}: base_model: RAM Desktop merges task vectors against a base; add base_model "
            "(the model the agents were fine-tuned from)"
        )
    base = _whole_model(where, "base_model", _model_ref(where, "base_model", data["base_model"]))
    models = data.get("models")
    if not isinstance(models, list) or not models:
        raise InputError(f"{where}: models: needs a list of models to merge")

    shared = dict(mapping.shared)
    given = data.get("parameters") or {}
    if not isinstance(given, dict):
        raise InputError(f"{where}: parameters must be a mapping")
    for key, value in given.items():
        if key not in shared:
            raise InputError(
                f"{where}: parameters.{key}: not a parameter RAM Desktop can express for {method} "
                f"(it takes {', '.join(shared) or 'none'})"
            )
        if isinstance(shared[key], bool):
            shared[key] = _flag(where, f"parameters.{key}", value)
        else:
            shared[key] = _number(where, f"parameters.{key}", value)

    agents: list[str] = []
    per_model: dict[str, list[tuple[str, float]]] = {k: [] for k in mapping.per_model}
    for i, entry in enumerate(models):
        at = f"models[{i}]"
        if not isinstance(entry, dict) or "model" not in entry:
            raise InputError(f"{where}: {at}: needs model: PATH")
        extra = sorted(set(entry) - {"model", "parameters"})
        if extra:
            raise InputError(f"{where}: {at}.{extra[0]}: unknown key, RAM Desktop cannot express it")
        source = _model_ref(where, f"{at}.model", entry["model"])
        _check_applied(where, f"{at}.model", source, base)
        if source == base:
            raise InputError(
                f"{where}: {at}.model: the base model listed as a model to merge; RAM Desktop merges "
                "the agents' task vectors against the base, remove it from models"
            )
        agents.append(source)
        params = entry.get("parameters") or {}
        if not isinstance(params, dict):
            raise InputError(f"{where}: {at}.parameters must be a mapping")
        for key, value in params.items():
            if key not in mapping.per_model:
                raise InputError(
                    f"{where}: {at}.parameters.{key}: not a per-model parameter RAM Desktop can express for {method}"
                )
            per_model[key].append((f"{at}.parameters.{key}", _number(where, f"{at}.parameters.{key}", value)))
        for key, default in mapping.per_model.items():
            if key not in params and default is not None:
                per_model[key].append((f"{at}.parameters.{key}", default))

    warnings: list[str] = []
    compute = _dtype(where, "dtype", data["dtype"]) if data.get("dtype") is not None else None
    out_dtype = (
        _dtype(where, "out_dtype", data["out_dtype"]) if data.get("out_dtype") is not None else compute or "base"
    )
    if compute not in (None, "float32"):
        warnings.append(
            f"dtype: {compute}: mergekit computes in {compute}; RAM Desktop computes in float32 and "
            f"rounds once to the output dtype ({out_dtype})"
        )

    our_method, recipe_params = mapping.convert(MergekitInput(where, method, shared, per_model, len(agents), warnings))
    eps = float(shared.get("epsilon", 1e-5))
    spec = MergeSpec.build(base, agents, method=our_method, params=recipe_params, eps=eps, out_dtype=out_dtype)
    return Imported(spec, warnings)


# --- export ------------------------------------------------------------------------------------------------------

CODE_NAMES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def _base_dtype(base: str) -> str | None:
    """The one float dtype of a local base's tensors (what ``out_dtype: base`` writes), from its headers; None
    for a Hub id or a base whose float tensors differ in dtype."""
    from ..storage.formats.local import open_local

    path = Path(base).expanduser()
    if not path.exists():
        return None
    try:
        checkpoint = open_local(path, base)
    except InputError:
        return None
    codes = {t.dtype for t in checkpoint.tensors.values() if t.dtype in CODE_NAMES}
    return CODE_NAMES[codes.pop()] if len(codes) == 1 else None


def to_mergekit(recipe: MergeSpec) -> str:
    """The closest mergekit YAML for a merge spec, a ``#`` comment on every difference (per-agent values go to
    each model's entry by the agent's name, whatever the order)."""
    m = recipe.method
    method = get_method(m)
    params = method.resolve(recipe.engine_params())
    if method.interop.mergekit is None:
        raise InputError(f"method {m} has no mergekit equivalent")
    exported = method.interop.mergekit.export(params, recipe.eps)
    shared, per_model, notes = exported.shared, exported.per_model, list(exported.notes)
    if recipe.vocab != "exact":
        notes.append("vocab: common (merge shared vocabulary rows) has no mergekit equivalent here")
    notes.append(
        f"shard size {recipe.shard_size}: see mergekit-yaml --out-shard-size; device {recipe.device}: "
        "pass --cuda for a GPU"
    )

    data: dict[str, Any] = {"merge_method": exported.method}
    if exported.base:
        data["base_model"] = recipe.base
    if recipe.slices is not None:
        data["slices"] = _export_slices(recipe, method, exported)
        shared = {} if any(s.get("parameters") for s in data["slices"]) else shared
    else:
        data["models"] = _export_models(recipe, per_model, exported)
    if shared:
        data["parameters"] = shared
    if exported.dtype is not None:
        data["dtype"] = exported.dtype
    out_dtype = recipe.out_dtype if recipe.out_dtype != "base" else _base_dtype(recipe.base)
    if out_dtype is not None:
        data["out_dtype"] = out_dtype
    else:
        notes.append(
            "out_dtype: base (the base's dtype) — mergekit writes dtype (float32) unless out_dtype is set; "
            "set out_dtype to the base's dtype"
        )
    if recipe.tokenizer is not None:
        data["tokenizer"] = _export_tokenizer(recipe)
    if recipe.chat_template is not None:
        data["chat_template"] = recipe.chat_template
    head = [
        (f"# mergekit configuration exported by RAM Desktop from a ram-recipe ({FORMAT}, method {m}); differences:")
    ]
    head += [f"# - {line}" for line in notes]
    if exported.dtype == "float32" and not method.streaming.theta:
        head.append("# dtype float32: RAM Desktop computes task vectors in float32 and rounds once to the output dtype")
    return "\n".join(head) + "\n" + yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def _export_tokenizer(recipe: MergeSpec) -> dict[str, Any]:
    """The recipe's ``tokenizer`` as mergekit's block: each model named by its path (``base``: the base's)."""

    def path(ref: str) -> str:
        if ref == "base":
            return recipe.base
        return recipe.sources[recipe.names.index(ref)] if ref in recipe.names else ref

    settings = thaw(recipe.tokenizer or {})
    source = str(settings["source"])
    out: dict[str, Any] = {"source": path(source.removeprefix("model:")) if source.startswith("model:") else source}
    if settings.get("tokens"):
        tokens = {}
        for token, rule in settings["tokens"].items():
            rule = dict(rule)
            if isinstance(rule.get("source"), str):
                rule["source"] = path(rule["source"])
            elif isinstance(rule.get("source"), Mapping) and "model" in rule["source"]:
                rule["source"] = {**rule["source"], "model": path(rule["source"]["model"])}
            tokens[token] = rule
        out["tokens"] = tokens
    if settings.get("pad_to_multiple_of"):
        out["pad_to_multiple_of"] = settings["pad_to_multiple_of"]
    return out


def _export_slices(recipe: MergeSpec, method: Any, exported: Any) -> list[dict[str, Any]]:
    """A spec's layer map as mergekit's ``slices``: each model's layer range as a source with its own
    parameters; a slice's shared parameters on the slice when any slice has parameters of its own."""
    models = [recipe.base, *recipe.sources]
    slices = recipe.engine_slices() or []
    own = any(s.get("parameters") is not None for s in slices)
    out = []
    for sl in slices:
        params = method.resolve(sl["parameters"] if sl.get("parameters") is not None else recipe.engine_params())
        ex = method.interop.mergekit.export(params, recipe.eps)
        sources = []
        for src in sl["sources"]:
            index = int(src["model"])
            if index == 0 and not ex.base and not method.streaming.stacks:
                continue  # the base only aligns the models (linear without a base): not an input
            entry: dict[str, Any] = {"model": models[index], "layer_range": list(src["layer_range"])}
            agent = index - 1
            values = {
                key: v[agent] if isinstance(v, list) else v
                for key, v in ex.per_agent.items()
                if agent >= 0 and (v[agent] if isinstance(v, list) else v) is not None
            }
            if values:
                entry["parameters"] = values
            sources.append(entry)
        item: dict[str, Any] = {"sources": sources}
        if own and ex.shared:
            item["parameters"] = ex.shared
        out.append(item)
    return out


def _export_models(recipe: MergeSpec, per_model: dict[str, Any], exported: Any) -> list[dict[str, Any]]:
    models = []
    for i, agent in enumerate(recipe.sources):
        if split_applied(agent) is None and is_adapter_folder(Path(agent).expanduser()):
            agent = f"{recipe.base}+{agent}"  # mergekit loads an adapter only applied to its model
        entry: dict[str, Any] = {"model": agent}
        own = dict(per_model)
        for key, values in exported.per_agent.items():
            value = values[i] if isinstance(values, list) else values
            if value is not None:
                own[key] = value
        if own:
            entry["parameters"] = own
        models.append(entry)
    return models
