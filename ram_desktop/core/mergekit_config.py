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
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

from .errors import InputError
from .safe_read import read_yaml
from .recipe import FORMAT, Recipe

# mergekit method -> (our method, its shared parameters with mergekit's defaults, its per-model parameters)
TASK_ARITHMETIC_SHARED = {"lambda": 1.0, "int8_mask": False}
SHARED: dict[str, dict[str, Any]] = {
    "linear": {"normalize": True},
    "task_arithmetic": {**TASK_ARITHMETIC_SHARED, "normalize": False, "rescale": False},
    "ties": {**TASK_ARITHMETIC_SHARED, "normalize": True, "rescale": False},
    "dare_linear": {**TASK_ARITHMETIC_SHARED, "normalize": False, "rescale": True},
    "dare_ties": {**TASK_ARITHMETIC_SHARED, "normalize": False, "rescale": True},
    "ram": {"epsilon": 1e-5},
    "ramplus_tl": {"r": 0.1, "alpha": 0.2, "epsilon": 1e-5},
}
PER_MODEL: dict[str, dict[str, Any]] = {
    "linear": {"weight": None},
    "task_arithmetic": {"weight": None, "density": 1.0},
    "ties": {"weight": None, "density": 1.0},
    "dare_linear": {"weight": None, "density": 1.0},
    "dare_ties": {"weight": None, "density": 1.0},
    "ram": {},
    "ramplus_tl": {},
}
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
    if method not in SHARED:
        raise InputError(f"{where}: merge_method: {method!r} has no RAM Desktop equivalent; supported: "
                         f"{', '.join(SHARED)}")
    if not data.get("base_model"):
        raise InputError(f"{where}: base_model: RAM Desktop merges task vectors against a base; add base_model "
                         "(the model the agents were fine-tuned from)")
    base = _model_ref(where, "base_model", data["base_model"])
    models = data.get("models")
    if not isinstance(models, list) or not models:
        raise InputError(f"{where}: models: needs a list of models to merge")

    shared = dict(SHARED[method])
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
    per_model: dict[str, list[tuple[str, float]]] = {k: [] for k in PER_MODEL[method]}
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
            if key not in PER_MODEL[method]:
                raise InputError(f"{where}: {at}.parameters.{key}: not a per-model parameter RAM Desktop can express "
                                 f"for {method}")
            per_model[key].append((f"{at}.parameters.{key}", _number(where, f"{at}.parameters.{key}", value)))
        for key, default in PER_MODEL[method].items():
            if key not in params and default is not None:
                per_model[key].append((f"{at}.parameters.{key}", default))

    warnings: list[str] = []
    compute = _dtype(where, "dtype", data["dtype"]) if data.get("dtype") is not None else None
    out_dtype = (_dtype(where, "out_dtype", data["out_dtype"]) if data.get("out_dtype") is not None
                 else compute or "base")
    if compute not in (None, "float32"):
        warnings.append(f"dtype: {compute}: mergekit computes in {compute}; RAM Desktop computes in float32 and "
                        f"rounds once to the output dtype ({out_dtype})")

    recipe_params, our_method = _convert(where, method, shared, per_model, len(agents), warnings)
    eps = float(shared.get("epsilon", 1e-5))
    recipe = Recipe(base=base, agents=agents, method=our_method, params=recipe_params, eps=eps, out_dtype=out_dtype)
    return Imported(recipe, warnings)


def _all_equal(where: str, values: list[tuple[str, float]], what: str, must: float | None = None) -> float | None:
    if not values:
        return None
    first_key, first = values[0]
    for key, value in values:
        if must is not None and value != must:
            raise InputError(f"{where}: {key} = {value:g}: {what}")
        if value != first:
            raise InputError(f"{where}: {key} = {value:g} differs from {first_key} = {first:g}: {what}")
    return first


def _convert(where: str, method: str, shared: dict, per_model: dict, n_agents: int,
             warnings: list[str]) -> tuple[dict, str]:
    """Our (parameters, method) for a mergekit method, or ``InputError`` naming the key."""
    if method == "ram":
        return {}, "ram"
    if method == "ramplus_tl":
        warnings.append("ramplus_tl: mergekit computes ρ per tensor (shared / unique within each tensor) and "
                        "defaults α to 0.2; RAM Desktop's ram-plus computes ρ over the whole model, as the paper "
                        f"defines it (paper default α = 2.0); using r = {shared['r']:g}, α = {shared['alpha']:g}")
        return {"r": shared["r"], "alpha": shared["alpha"]}, "ram-plus"

    weights = per_model["weight"]
    if len(weights) < n_agents:
        missing = n_agents - len(weights)
        raise InputError(f"{where}: models[*].parameters.weight: {missing} model(s) without a weight "
                         f"(mergekit requires one for {method}); write weight: 1.0")
    if method == "linear":
        _all_equal(where, weights, "RAM Desktop's average weights every agent equally")
        if not shared["normalize"]:
            raise InputError(f"{where}: parameters.normalize: false makes linear a weighted sum, which RAM Desktop "
                             "cannot express; remove it")
        warnings.append("linear: mergekit averages the listed models' weights (and adds base_model to the inputs); "
                        "RAM Desktop's average is base + mean of the agents' task vectors")
        return {}, "average"

    _all_equal(where, weights, "RAM Desktop weights every agent by 1; put the scale in parameters.lambda", must=1.0)
    scale = shared["lambda"]
    if method == "task_arithmetic":
        _all_equal(where, per_model["density"], "task_arithmetic does not sparsify", must=1.0)
        if shared["normalize"]:
            if scale != 1.0:
                raise InputError(f"{where}: parameters.normalize: true with lambda ≠ 1 cannot be expressed "
                                 "(it is the average times lambda); use normalize: false or lambda: 1")
            return {}, "average"
        return {"scale": scale}, "task-arithmetic"

    density = _all_equal(where, per_model["density"], "RAM Desktop uses one density for every agent")
    assert density is not None
    if method == "ties":
        if not shared["normalize"]:
            raise InputError(f"{where}: parameters.normalize: false (a disjoint sum) cannot be expressed; "
                             "RAM Desktop's TIES takes the disjoint mean, set normalize: true")
        if shared["rescale"]:
            raise InputError(f"{where}: parameters.rescale: true (L1 rescale of the trimmed values) cannot be "
                             "expressed; remove it")
        if not 0.0 < density <= 1.0:
            raise InputError(f"{where}: models[*].parameters.density must be in (0, 1], got {density:g}")
        warnings.append("ties: RAM Desktop keeps exactly ⌊k·n⌋ elements per tensor (exact rational k; earliest "
                        "positions win among equal magnitudes at the cut); mergekit keeps int(k·n) by a float "
                        "product and picks ties with a non-stable argsort")
        return {"density": density, "scale": scale, "ties_scope": "tensor"}, "ties"

    # dare_linear, dare_ties
    if not shared["rescale"]:
        raise InputError(f"{where}: parameters.rescale: false (no rescale of the kept values) cannot be expressed; "
                         "RAM Desktop divides them by 1 − p")
    if method == "dare_ties" and not shared["normalize"]:
        raise InputError(f"{where}: parameters.normalize: false (mergekit's default for dare_ties: a disjoint sum) "
                         "cannot be expressed; RAM Desktop's dare-ties takes the disjoint mean, set normalize: true")
    if method == "dare_linear" and shared["normalize"]:
        raise InputError(f"{where}: parameters.normalize: true (dividing by the number of models) cannot be "
                         "expressed for dare_linear; remove it and put the scale in lambda")
    if not 0.0 < density <= 1.0:
        raise InputError(f"{where}: models[*].parameters.density must be in (0, 1], got {density:g}")
    drop = float(Decimal(1) - Decimal(repr(density)))
    warnings.append(f"{method}: RAM Desktop drops with a seeded counter-based mask and divides the kept values by "
                    f"1 − p (p = 1 − density = {drop:g}); mergekit draws torch.bernoulli and rescales each tensor "
                    "to its L1 norm, so the results differ in which elements survive and by how much they grow")
    return {"drop": drop, "seed": 0, "scale": scale}, ("dare-ta" if method == "dare_linear" else "dare-ties")


# --- export ------------------------------------------------------------------------------------------------------

def to_mergekit(recipe: Recipe) -> str:
    """The closest mergekit YAML for a recipe, a ``#`` comment on every difference."""
    from .methods import get_method

    params = get_method(recipe.method).resolve(recipe.params)
    notes: list[str] = []
    shared: dict[str, Any] = {}
    per_model: dict[str, Any] = {}
    m = recipe.method
    if m == "ram":
        method = "ram"
        shared["epsilon"] = recipe.eps
        notes.append("ram: same per-element rule. With two agents the output is bit-identical; with more, mergekit "
                     "sums τ_t/c_i where RAM Desktop divides the sum by c_i, which can differ in the last bit")
    elif m in ("ram-plus", "ram-plus-soft"):
        method = "ramplus_tl"
        shared.update(r=params["r"], alpha=params["alpha"] if m == "ram-plus" else 1.0, epsilon=recipe.eps)
        notes.append("ramplus_tl computes ρ per tensor (shared / unique within each tensor; a tensor without unique "
                     "elements gets λ = 1 + r·α); RAM Desktop computes ρ once over the whole model. Results differ")
        if m == "ram-plus-soft":
            notes.append("ram-plus-soft (λ = 1 + r·ρ/(1+ρ)) has no mergekit equivalent; ramplus_tl with α = 1 "
                         "is the closest clipped form")
    elif m == "average":
        method = "task_arithmetic"
        shared.update(normalize=True)
        per_model["weight"] = 1.0
        notes.append("average = base + (Σ τ_t)/N: task_arithmetic with weight 1 and normalize: true computes the "
                     "same (mergekit's linear would average the models' weights, base included)")
    elif m == "task-arithmetic":
        method = "task_arithmetic"
        shared["lambda"] = params["scale"]
        per_model["weight"] = 1.0
        notes.append("task_arithmetic with weight 1 and lambda = scale computes base + λ·Σ τ_t like RAM Desktop "
                     "(bit-identical with dtype float32)")
    elif m == "ties":
        method = "ties"
        shared.update({"lambda": params["scale"], "normalize": True})
        per_model.update(weight=1.0, density=params["density"])
        notes.append("ties: mergekit keeps int(k·n) elements per tensor (float product: int(0.29·100) = 28) and "
                     "breaks ties at the cut with a non-stable argsort; RAM Desktop keeps exactly ⌊k·n⌋ with the "
                     "earliest positions winning")
        if params["ties_scope"] == "model":
            notes.append("ties_scope: model (one trim over the whole task vector) has no mergekit equivalent; "
                         "mergekit trims per tensor")
    elif m in ("dare-ta", "dare-ties"):
        method = "dare_linear" if m == "dare-ta" else "dare_ties"
        shared.update({"lambda": params["scale"], "rescale": True})
        if m == "dare-ties":
            shared["normalize"] = True
        per_model.update(weight=1.0, density=float(Decimal(1) - Decimal(repr(params["drop"]))))
        notes.append(f"{method}: density = 1 − p. mergekit rescales kept values to each tensor's L1 norm "
                     "(rescale: true; false keeps them unscaled) where RAM Desktop divides by 1 − p, and draws its "
                     f"mask with torch.bernoulli (mergekit-yaml --random-seed) instead of seed {params['seed']}'s "
                     "counter-based hash: different elements survive")
    else:
        raise InputError(f"method {m} has no mergekit equivalent")
    if recipe.vocab != "exact":
        notes.append("vocab: common (merge shared vocabulary rows) has no mergekit equivalent here")
    notes.append(f"shard size {recipe.shard_size}: see mergekit-yaml --out-shard-size; device {recipe.device}: "
                 "pass --cuda for a GPU")

    data: dict[str, Any] = {"merge_method": method, "base_model": recipe.base, "models": []}
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
    head = ["# mergekit configuration exported by RAM Desktop from a ram-recipe "
            f"({FORMAT}, method {m}); differences:"]
    head += [f"# - {line}" for line in notes]
    head.append("# dtype float32: RAM Desktop computes task vectors in float32 and rounds once to the output dtype")
    return "\n".join(head) + "\n" + yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
