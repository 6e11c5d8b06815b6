"""mergekit merge configurations in and out.

``from_mergekit`` turns a mergekit YAML (``merge_method``, ``base_model``, ``models``, ``parameters``,
``dtype``, ``out_dtype``) into a ``Recipe`` when RAM Desktop has the method, and refuses, naming the
key, whatever it cannot express: slices, modules, per-layer value lists (gradients), filtered
parameters, tokenizer settings, LoRA references, unequal per-model weights or densities, and
switches that change the arithmetic (``normalize``, ``rescale``) where ours has no equivalent.
Differences that remain (TIES's cut, DARE's mask and rescale, RAM+'s per-tensor ρ, compute dtype)
come back as warnings.

``to_mergekit`` writes the closest mergekit YAML for a recipe, with a YAML comment on every
difference. Semantics follow mergekit 0.1.5 (``merge_methods/generalized_task_arithmetic.py``,
``merge_methods/ram.py``, ``sparsify.py``, ``config.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import InputError
from ..methods import METHODS, get_method
from ..methods.mergekit_map import MergekitImport, MergekitInput
from ..recipe import FORMAT, Recipe
from ..storage.safe_read import read_yaml


def _imports() -> dict[str, MergekitImport]:
    """Every mergekit ``merge_method`` a registered method reads (``MergeMethod.mergekit``), by mergekit's name."""
    return {imp.name: imp for m in METHODS.values() if m.mergekit is not None for imp in m.mergekit.imports}


TOP_LEVEL = {"merge_method", "base_model", "models", "parameters", "dtype", "out_dtype"}
REFUSED_TOP_LEVEL = {
    "slices": "layer slices (RAM Desktop merges whole models with one base)",
    "modules": "per-module definitions (RAM Desktop merges whole models with one base)",
    "tokenizer_source": "tokenizer merging (RAM Desktop copies the base's tokenizer; use --vocab common for "
                        "differing vocabulary sizes)",
    "tokenizer": "tokenizer merging (RAM Desktop copies the base's tokenizer)",
    "chat_template": "a chat template override (RAM Desktop copies the base's tokenizer files)",
}
DTYPES = {"float32": "float32", "fp32": "float32", "float": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16", "half": "float16"}


@dataclass
class Imported:
    """A mergekit configuration as a recipe, with what differs from mergekit's run of the same file."""

    recipe: Recipe
    warnings: list[str] = field(default_factory=list)


def is_mergekit(data: Any) -> bool:
    """A mapping with ``merge_method`` and without our ``format`` key."""
    return isinstance(data, dict) and "merge_method" in data and "format" not in data


def load_recipe_or_mergekit(path: Path) -> Imported:
    """``ram-merge run``'s reader: a RAM Desktop recipe, or a mergekit configuration converted."""
    data = _read_yaml(Path(path))
    if is_mergekit(data):
        return from_mergekit(data, str(path))
    return Imported(Recipe.from_dict(data, str(path)))


def load_mergekit(path: Path) -> Imported:
    data = _read_yaml(Path(path))
    if not is_mergekit(data):
        raise InputError(f"{path}: not a mergekit configuration (needs merge_method)")
    return from_mergekit(data, str(path))


def _read_yaml(path: Path) -> Any:
    return read_yaml(path)


def _scalar(where: str, key: str, value: Any) -> Any:
    """A plain value; gradients (lists) and filtered values (mappings) are refused."""
    if isinstance(value, list):
        raise InputError(f"{where}: {key} is a per-layer value list (gradient); RAM Desktop uses one value "
                         "for the whole model, write a single number")
    if isinstance(value, dict):
        raise InputError(f"{where}: {key} has filtered values (filter/value); RAM Desktop uses one value "
                         "for every tensor, write a single number")
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


def _model_ref(where: str, key: str, ref: Any) -> str:
    """mergekit's ``model`` value as our source text (``path``, ``org/name`` or ``org/name@revision``)."""
    if isinstance(ref, dict):
        if ref.get("lora"):
            raise InputError(f"{where}: {key}.lora (a LoRA applied on the fly) cannot be expressed; "
                             "merge the adapter into its model first")
        inner = ref.get("model", ref)
        if isinstance(inner, dict):
            path, revision = inner.get("path"), inner.get("revision")
        else:
            path, revision = inner, None
        if not path:
            raise InputError(f"{where}: {key} names no model path")
        return f"{path}@{revision}" if revision else str(path)
    if not isinstance(ref, str) or not ref.strip():
        raise InputError(f"{where}: {key} must name a model (a folder or org/name)")
    if "+" in ref and not Path(ref).exists():
        raise InputError(f"{where}: {key} = {ref!r} applies a LoRA (model+lora), which cannot be expressed; "
                         "merge the adapter into its model first")
    return ref.strip()


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
    unknown = sorted(set(data) - TOP_LEVEL - set(REFUSED_TOP_LEVEL))
    if unknown:
        raise InputError(f"{where}: {unknown[0]}: unknown mergekit key, RAM Desktop cannot express it")
    method = str(data.get("merge_method"))
    imports = _imports()
    if method not in imports:
        raise InputError(f"{where}: merge_method: {method!r} has no RAM Desktop equivalent; supported: "
                         f"{', '.join(imports)}")
    mapping = imports[method]
    if not data.get("base_model"):
        raise InputError(f"{where}: base_model: RAM Desktop merges task vectors against a base; add base_model "
                         "(the model the agents were fine-tuned from)")
    base = _model_ref(where, "base_model", data["base_model"])
    models = data.get("models")
    if not isinstance(models, list) or not models:
        raise InputError(f"{where}: models: needs a list of models to merge")

    shared = dict(mapping.shared)
    given = data.get("parameters") or {}
    if not isinstance(given, dict):
        raise InputError(f"{where}: parameters must be a mapping")
    for key, value in given.items():
        if key not in shared:
            raise InputError(f"{where}: parameters.{key}: not a parameter RAM Desktop can express for {method} "
                             f"(it takes {', '.join(shared) or 'none'})")
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
        if source == base:
            raise InputError(f"{where}: {at}.model: the base model listed as a model to merge; RAM Desktop merges "
                             "the agents' task vectors against the base, remove it from models")
        agents.append(source)
        params = entry.get("parameters") or {}
        if not isinstance(params, dict):
            raise InputError(f"{where}: {at}.parameters must be a mapping")
        for key, value in params.items():
            if key not in mapping.per_model:
                raise InputError(f"{where}: {at}.parameters.{key}: not a per-model parameter RAM Desktop can express "
                                 f"for {method}")
            per_model[key].append((f"{at}.parameters.{key}", _number(where, f"{at}.parameters.{key}", value)))
        for key, default in mapping.per_model.items():
            if key not in params and default is not None:
                per_model[key].append((f"{at}.parameters.{key}", default))

    warnings: list[str] = []
    compute = _dtype(where, "dtype", data["dtype"]) if data.get("dtype") is not None else None
    out_dtype = (_dtype(where, "out_dtype", data["out_dtype"]) if data.get("out_dtype") is not None
                 else compute or "base")
    if compute not in (None, "float32"):
        warnings.append(f"dtype: {compute}: mergekit computes in {compute}; RAM Desktop computes in float32 and "
                        f"rounds once to the output dtype ({out_dtype})")

    our_method, recipe_params = mapping.convert(MergekitInput(where, method, shared, per_model, len(agents), warnings))
    eps = float(shared.get("epsilon", 1e-5))
    recipe = Recipe(base=base, agents=agents, method=our_method, params=recipe_params, eps=eps, out_dtype=out_dtype)
    return Imported(recipe, warnings)


# --- export ------------------------------------------------------------------------------------------------------

def to_mergekit(recipe: Recipe) -> str:
    """The closest mergekit YAML for a recipe, a ``#`` comment on every difference."""
    m = recipe.method
    method = get_method(m)
    params = method.resolve(recipe.params)
    if method.mergekit is None:
        raise InputError(f"method {m} has no mergekit equivalent")
    exported = method.mergekit.export(params, recipe.eps)
    shared, per_model, notes = exported.shared, exported.per_model, list(exported.notes)
    if recipe.vocab != "exact":
        notes.append("vocab: common (merge shared vocabulary rows) has no mergekit equivalent here")
    notes.append(f"shard size {recipe.shard_size}: see mergekit-yaml --out-shard-size; device {recipe.device}: "
                 "pass --cuda for a GPU")

    data: dict[str, Any] = {"merge_method": exported.method, "base_model": recipe.base, "models": []}
    for agent in recipe.agents:
        entry: dict[str, Any] = {"model": agent}
        if per_model:
            entry["parameters"] = dict(per_model)
        data["models"].append(entry)
    if shared:
        data["parameters"] = shared
    data["dtype"] = "float32"
    if recipe.out_dtype != "base":
        data["out_dtype"] = recipe.out_dtype
    else:
        notes.append("out_dtype: base (the base's dtype) — mergekit writes dtype (float32) unless out_dtype is set; "
                     "set out_dtype to the base's dtype")
    head = [("# mergekit configuration exported by RAM Desktop from a ram-recipe "
             f"({FORMAT}, method {m}); differences:")]
    head += [f"# - {line}" for line in notes]
    head.append("# dtype float32: RAM Desktop computes task vectors in float32 and rounds once to the output dtype")
    return "\n".join(head) + "\n" + yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
