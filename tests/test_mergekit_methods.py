"""mergekit 0.1.5's methods and parameter shapes: the same YAML through ``ram-merge run`` (a fresh process) and
through ``mergekit-yaml`` gives the same tensors, bit for bit (skipped without mergekit, see
benchmarks/setup_mergekit.sh and RAM_MERGEKIT)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests import reference as ref
from tests.conftest import SMALL_CONFIG, make_models


def _mergekit() -> str | None:
    exe = os.environ.get("RAM_MERGEKIT") or "/work/mergekit-venv/bin/mergekit-yaml"
    return exe if Path(exe).is_file() and os.access(exe, os.X_OK) else None


needs_mergekit = pytest.mark.skipif(
    _mergekit() is None, reason="mergekit not installed (set RAM_MERGEKIT=/path/to/mergekit-yaml)"
)

AGENTS = {"alpha": 0.5, "beta": 0.55, "gamma": 0.04, "delta": 0.3}
GRADIENT = [0.2, 0.9, 0.4]
FILTERS = [{"filter": "self_attn", "value": 0.7}, {"filter": "mlp", "value": [0.1, 0.6]}, {"value": 0.35}]


def _run_ours(config: Path, out: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ram_desktop", "-q", "run", str(config), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def _run_mergekit(config: Path, out: Path) -> None:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [_mergekit(), str(config), str(out)], capture_output=True, text=True, env=env, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def _assert_same_tensors(ours: Path, theirs: Path) -> None:
    a, b = ref.load_model(ours), ref.load_model(theirs)
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        assert torch.equal(a[name].view(torch.uint8), b[name].view(torch.uint8)), name


def _models(tmp_path: Path, n: int, shards: int = 1) -> tuple[Path, list[Path]]:
    # five decoder layers: a gradient's positions 0, 1/4, 1/2, 3/4, 1 all occur
    return make_models(
        tmp_path / "in",
        agents=dict(list(AGENTS.items())[:n]),
        shards=shards,
        config=dict(SMALL_CONFIG, num_hidden_layers=5),
    )


def _config(method: str, base: Path | None, models: list[Path], per_model: list[dict | None], **top) -> dict:
    data: dict = {"merge_method": method}
    if base is not None:
        data["base_model"] = str(base)
    data["models"] = [{"model": str(m), **({"parameters": p} if p else {})} for m, p in zip(models, per_model)]
    data.update(top)
    return data


CASES = [
    # (id, method, n agents, per-model parameters per agent, shared parameters, base listed among the models)
    ("ta-weights", "task_arithmetic", 3, [{"weight": 0.3}, {"weight": 0.5}, {"weight": 1.2}], {"lambda": 0.8}, False),
    ("ta-base-listed", "task_arithmetic", 2, [{"weight": 0.3}, {"weight": 0.7}], {"normalize": True}, True),
    ("ta-gradient", "task_arithmetic", 2, [{"weight": GRADIENT}, {"weight": 0.5}], {}, False),
    ("ta-filters", "task_arithmetic", 2, [{"weight": FILTERS}, None], {"weight": 0.25}, False),
    (
        "ties",
        "ties",
        3,
        [{"weight": 0.4, "density": 0.3}, {"weight": 0.8, "density": 0.6}, {"weight": 1.0, "density": [0.2, 0.9]}],
        {},
        False,
    ),
    (
        "ties-int8",
        "ties",
        2,
        [{"weight": 1.0, "density": 0.5}, {"weight": 0.5, "density": 0.5}],
        {"int8_mask": True, "lambda": 0.9},
        True,
    ),
    (
        "breadcrumbs",
        "breadcrumbs",
        2,
        [{"weight": 0.5, "density": 0.6, "gamma": 0.02}, {"weight": 0.5, "density": 0.7}],
        {},
        False,
    ),
    (
        "breadcrumbs-ties",
        "breadcrumbs_ties",
        3,
        [{"weight": 0.5, "density": 0.6}, {"weight": 0.7, "density": 0.8}, {"weight": 0.2, "density": 0.5}],
        {"gamma": 0.05},
        False,
    ),
    ("linear", "linear", 3, [{"weight": 0.2}, {"weight": 0.3}, {"weight": 0.5}], {}, None),
    ("linear-base", "linear", 2, [{"weight": 0.2}, {"weight": [0.3, 0.6]}], {"weight": 0.5}, False),
    ("slerp", "slerp", 1, [None], {"t": 0.3}, True),
    (
        "slerp-filters",
        "slerp",
        1,
        [None],
        {
            "t": [
                {"filter": "self_attn", "value": [0, 0.5, 0.3, 0.7, 1]},
                {"filter": "mlp", "value": [1, 0.5, 0.7, 0.3, 0]},
                {"value": 0.5},
            ]
        },
        False,
    ),
    ("model-stock", "model_stock", 3, [None, None, None], {}, False),
    ("model-stock-filter-wise", "model_stock", 2, [None, None], {"filter_wise": True}, True),
    ("nuslerp", "nuslerp", 2, [{"weight": 0.3}, {"weight": [0.2, 0.9]}], {}, False),
    (
        "nuslerp-no-base-rows",
        "nuslerp",
        2,
        [{"weight": 0.6}, {"weight": 0.4}],
        {"nuslerp_flatten": False, "nuslerp_row_wise": True},
        None,
    ),
    ("multislerp", "multislerp", 3, [{"weight": 0.2}, {"weight": 0.5}, {"weight": 0.3}], {}, False),
    (
        "multislerp-no-base",
        "multislerp",
        3,
        [{"weight": 1.0}, {"weight": 2.0}, {"weight": 0.5}],
        {"normalize_weights": True},
        None,
    ),
    ("karcher", "karcher", 2, [None, None], {"max_iter": 5}, False),
    ("sce", "sce", 3, [None, None, None], {"select_topk": 0.5}, False),
    ("sce-all-int8", "sce", 2, [None, None], {"int8_mask": True}, True),
    ("nearswap", "nearswap", 1, [None], {"t": [0.0001, 0.01]}, False),
    ("arcee-fusion", "arcee_fusion", 1, [None], {}, True),
]


OUT_DTYPES = ("float32", "bfloat16")


def _write_case(folder: Path, case: tuple, out_dtype: str) -> Path:
    """The inputs (bfloat16 output: sharded inputs) and the mergekit YAML of one case, in ``folder``."""
    _, method, n, per_model, shared, base_listed = case
    base, agents = _models(folder, n, shards=2 if out_dtype == "bfloat16" else 1)
    models = [base, *agents] if base_listed else agents
    params = (
        [{"weight": 0.5}] + per_model
        if base_listed and method == "linear"
        else ([None] + per_model if base_listed else per_model)
    )
    top: dict = {"dtype": "float32", "out_dtype": out_dtype}
    if shared:
        top["parameters"] = shared
    data = _config(method, None if base_listed is None else base, models, params, **top)
    config = folder / "mk.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    return config


@pytest.fixture(scope="module")
def mergekit_outputs(tmp_path_factory) -> dict[tuple[str, str], Path]:
    """Every case's YAML run by mergekit, all in one process of mergekit's venv (``tests/mergekit_batch.py``: what
    mergekit-yaml does per file, without its start-up per file); case id and out dtype -> the case's folder."""
    root = tmp_path_factory.mktemp("mergekit-cases")
    folders, jobs = {}, []
    for case in CASES:
        for out_dtype in OUT_DTYPES:
            folder = root / f"{case[0]}-{out_dtype}"
            config = _write_case(folder, case, out_dtype)
            folders[case[0], out_dtype] = folder
            jobs.append([str(config), str(folder / "mk")])
    (root / "jobs.json").write_text(json.dumps(jobs))
    python = Path(_mergekit()).parent / "python"
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [str(python), str(Path(__file__).with_name("mergekit_batch.py")), str(root / "jobs.json")],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return folders


@needs_mergekit
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
def test_mergekit_config_gives_mergekit_bytes(mergekit_outputs, case, out_dtype):
    folder = mergekit_outputs[case[0], out_dtype]
    _run_ours(folder / "mk.yaml", folder / "ours")
    _assert_same_tensors(folder / "ours", folder / "mk")


EXPORTS = [
    ("slerp", 1, {"t": [{"filter": "mlp", "value": [0.1, 0.9]}, {"value": 0.4}], "dtype": "float32"}),
    ("weighted-ties", 3, {"weight": [0.5, [0.2, 1.0], 1.0], "density": [0.3, 0.5, 0.8], "lambda": 0.9}),
    ("linear", 2, {"weight": [1.0, 3.0]}),
    ("model-stock", 2, {}),
    ("breadcrumbs-ties", 2, {"weight": 1.0, "density": 0.6, "gamma": [0.02, 0.05]}),
]


@needs_mergekit
@pytest.mark.parametrize("method,n,params", EXPORTS, ids=[e[0] for e in EXPORTS])
def test_exported_recipe_runs_in_mergekit_with_our_bytes(tmp_path, method, n, params):
    """A recipe of mergekit's methods (gradients, filters, per-agent values), exported with ``export-mergekit``:
    mergekit-yaml gives the bytes ``ram-merge run`` gives for the recipe, out_dtype (the base's) included."""
    from ram_desktop.core import MergeSpec

    base, agents = _models(tmp_path, n)
    MergeSpec.build(str(base), [str(a) for a in agents], method=method, params=params).save(tmp_path / "r.yaml")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ram_desktop",
            "-q",
            "export-mergekit",
            str(tmp_path / "r.yaml"),
            "--out",
            str(tmp_path / "mk.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load((tmp_path / "mk.yaml").read_text())["out_dtype"] == "bfloat16"
    _run_mergekit(tmp_path / "mk.yaml", tmp_path / "mk")
    _run_ours(tmp_path / "r.yaml", tmp_path / "ours")
    _assert_same_tensors(tmp_path / "ours", tmp_path / "mk")


# --- slices: sliced merges and layer stacking (passthrough) ---------------------------------------------------------

SLERP_T = [
    {"filter": "self_attn", "value": [0, 0.5, 0.3, 0.7, 1]},
    {"filter": "mlp", "value": [1, 0.5, 0.7, 0.3, 0]},
    {"value": 0.5},
]


def _llama(folder: Path, n: int, shards: int) -> list[Path]:
    """Base and agents as Llama checkpoints (Qwen2's tensors without the attention biases): mergekit 0.1.5 cannot
    write the config of a stacked Qwen2 with transformers 5 (it sets num_hidden_layers but leaves layer_types)."""
    from tests.synthetic import write_model

    base, agents = _models(folder / "qwen", n, shards)
    cfg = dict(SMALL_CONFIG, num_hidden_layers=5, architectures=["LlamaForCausalLM"], model_type="llama")
    return [
        write_model(
            folder / p.name, {k: v for k, v in ref.load_model(p).items() if not k.endswith(".bias")}, cfg, shards
        )
        for p in [base, *agents]
    ]


def _src(model: Path, start: int, stop: int, **params) -> dict:
    return {"model": str(model), "layer_range": [start, stop], **({"parameters": params} if params else {})}


def _slices_case(folder: Path, case: str, out_dtype: str) -> dict:
    shards = 2 if out_dtype == "bfloat16" else 1
    top: dict = {"dtype": "float32", "out_dtype": out_dtype}
    if case.startswith("passthrough"):
        a, b = _llama(folder / "in", 1, shards)
        scale = case == "passthrough-scale"
        first = _src(a, 0, 3, scale=0.5) if scale else _src(a, 0, 3)
        second = {"sources": [_src(b, 1, 5)], **({"parameters": {"scale": [1.0, 2.0]}} if scale else {})}
        return {"slices": [{"sources": [first]}, second], "merge_method": "passthrough", **top}
    base, agents = _models(folder / "in", 1 if case.startswith("slerp") else 2, shards)
    whole = [(0, 5)]
    halves = [(0, 2), (2, 5)]
    if case == "slerp-one-slice":
        ranges, method, shared, own = whole, "slerp", {"t": SLERP_T}, [{}, {}]
    elif case == "slerp-two-slices":
        ranges, method, shared, own = halves, "slerp", {"t": SLERP_T}, [{}, {}]
    elif case == "ties-two-slices":
        ranges, method, shared, own = (
            halves,
            "ties",
            {"normalize": True},
            [{"weight": 0.6, "density": [0.2, 0.8]}, {"weight": GRADIENT, "density": 0.5}],
        )
    elif case == "task-arithmetic-slices":
        ranges, method, shared, own = halves, "task_arithmetic", {"weight": FILTERS}, [{"weight": 0.3}, {}]
    else:  # linear over two slices, the second with parameters of its own
        ranges, method, shared, own = halves, "linear", {}, [{"weight": 0.2}, {"weight": [0.3, 0.6]}]
    slices = []
    for g, (start, stop) in enumerate(ranges):
        sources = [_src(base, start, stop)] if method != "linear" else []
        sources += [_src(m, start, stop, **p) for m, p in zip(agents, own)]
        item: dict = {"sources": sources}
        if g == 1 and method in ("slerp", "linear"):
            item["parameters"] = {"t": 0.25} if method == "slerp" else {"weight": 0.9}
        slices.append(item)
    data = {"slices": slices, "merge_method": method, **top}
    if method != "linear":
        data["base_model"] = str(base)
    if shared:
        data["parameters"] = shared
    return data


SLICE_CASES = [
    "slerp-one-slice",
    "slerp-two-slices",
    "ties-two-slices",
    "task-arithmetic-slices",
    "linear-slices",
    "passthrough",
    "passthrough-scale",
]


@pytest.fixture(scope="module")
def mergekit_slices(tmp_path_factory) -> dict[tuple[str, str], Path]:
    """Every slices case run by mergekit in one process of its venv (as ``mergekit_outputs``)."""
    root = tmp_path_factory.mktemp("mergekit-slices")
    folders, jobs = {}, []
    for case in SLICE_CASES:
        for out_dtype in OUT_DTYPES:
            folder = root / f"{case}-{out_dtype}"
            config = folder / "mk.yaml"
            data = _slices_case(folder, case, out_dtype)
            config.write_text(yaml.safe_dump(data, sort_keys=False))
            folders[case, out_dtype] = folder
            jobs.append([str(config), str(folder / "mk")])
    (root / "jobs.json").write_text(json.dumps(jobs))
    python = Path(_mergekit()).parent / "python"
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [str(python), str(Path(__file__).with_name("mergekit_batch.py")), str(root / "jobs.json")],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return folders


@needs_mergekit
@pytest.mark.parametrize("case", SLICE_CASES)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
def test_mergekit_slices_give_mergekit_bytes(mergekit_slices, case, out_dtype):
    """Sliced merges (one slice, two slices with the gradient restarting in each, slice and source parameters)
    and layer stacking (overlapping ranges of two models, with and without scale): mergekit's tensors, names and
    layer count."""
    folder = mergekit_slices[case, out_dtype]
    _run_ours(folder / "mk.yaml", folder / "ours")
    _assert_same_tensors(folder / "ours", folder / "mk")
    ours, theirs = (json.loads((folder / d / "config.json").read_text()) for d in ("ours", "mk"))
    assert ours["num_hidden_layers"] == theirs["num_hidden_layers"] == (7 if case.startswith("passthrough") else 5)


@needs_mergekit
@pytest.mark.parametrize("case", ["slerp-two-slices", "passthrough-scale"])
def test_exported_slices_run_in_mergekit_with_our_bytes(tmp_path, case):
    """``export-mergekit`` of a recipe with slices (read from a mergekit config, so with per-slice parameters):
    mergekit-yaml gives the bytes ``ram-merge run`` gives for the recipe."""
    config = tmp_path / "in.yaml"
    config.write_text(yaml.safe_dump(_slices_case(tmp_path, case, "bfloat16"), sort_keys=False))
    _run_ours(config, tmp_path / "first")
    recipe = tmp_path / "first" / "ram-recipe.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "ram_desktop", "-q", "export-mergekit", str(recipe), "--out", str(tmp_path / "mk.yaml")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "slices" in yaml.safe_load((tmp_path / "mk.yaml").read_text())
    _run_mergekit(tmp_path / "mk.yaml", tmp_path / "mk")
    _run_ours(recipe, tmp_path / "ours")
    _assert_same_tensors(tmp_path / "ours", tmp_path / "mk")
