"""Per-tensor parameter values (docs/methods.md, "Parameter values"): gradients over layers and filters by tensor
name, checked against plain hand-written references; a gradient recipe through ``ram-merge run`` (a fresh process)
against a whole-tensor reference; the random mergekit-family methods deterministic for a seed and keeping the
asked share in expectation."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from ram_desktop.core import MergeSpec
from ram_desktop.core.errors import InputError
from ram_desktop.core.methods import get_method
from ram_desktop.core.methods.settings import check_setting, count_layers, evaluate, layer_position, resolve
from tests import reference as ref
from tests.conftest import SMALL_CONFIG, make_models


def _num(x):
    return float(x)


def test_layer_position_follows_mergekit():
    names = [f"model.layers.{i}.mlp.up_proj.weight" for i in range(5)] + ["model.embed_tokens.weight", "lm_head.weight"]
    assert count_layers(names) == 5
    assert [layer_position(n, 5) for n in names] == [0.0, 0.25, 0.5, 0.75, 1.0, 0.0, 0.0]
    assert layer_position("model.layers.0.mlp.up_proj.weight", 1) == 1.0
    assert layer_position("model.norm.weight", 5) == 0.0


@pytest.mark.parametrize(
    "t,expected", [(0.0, 0.2), (0.25, 0.2 + 0.5 * (0.9 - 0.2)), (0.5, 0.9), (0.75, 0.9 + 0.5 * (0.4 - 0.9)), (1.0, 0.4)]
)
def test_gradient_interpolates_linearly_between_neighbours(t, expected):
    assert evaluate([0.2, 0.9, 0.4], "x", t, _num) == pytest.approx(expected, abs=1e-15)


def test_filters_first_match_wins_then_fallback_then_next_source():
    filters = [
        {"filter": "self_attn", "value": 0.7},
        {"filter": "attn", "value": 0.1},
        {"filter": "mlp", "value": [0.0, 1.0]},
    ]
    assert evaluate(filters, "model.layers.0.self_attn.q_proj.weight", 0.0, _num) == 0.7
    assert evaluate(filters, "model.layers.3.mlp.up_proj.weight", 0.75, _num) == 0.75
    missing = evaluate(filters, "model.norm.weight", 0.0, _num)
    assert resolve([filters, 0.3], "model.norm.weight", 0.0, _num, 1.0) == 0.3
    assert resolve([filters, None], "model.norm.weight", 0.0, _num, 1.0) == 1.0
    assert missing is not None and missing != 0.3
    assert evaluate(filters + [{"value": 0.5}], "model.norm.weight", 0.0, _num) == 0.5
    assert evaluate([{"filter": "*", "value": 0.9}], "anything", 0.0, _num) == 0.9


@pytest.mark.parametrize(
    "bad", [[], [{"filter": "mlp"}], [{"value": 1, "when": 2}], [{"filter": 3, "value": 1}], {"value": {"nested": 1}}]
)
def test_malformed_settings_are_refused(bad):
    with pytest.raises(InputError):
        check_setting("weight", bad, _num)


def test_per_agent_setting_param_validates_each_entry():
    weight = next(p for p in get_method("weighted-task-arithmetic").params if p.name == "weight")
    assert weight.validate("0.3,0.5") == [0.3, 0.5]
    assert weight.validate([[0.1, 0.2], {"filter": "mlp", "value": 2}]) == [[0.1, 0.2], [{"filter": "mlp", "value": 2}]]
    assert weight.validate(0.4) == 0.4  # one value for every agent
    assert weight.validate("0.4") == 0.4
    with pytest.raises(InputError):
        weight.validate("0.3,,0.5")


FIVE_LAYERS = dict(SMALL_CONFIG, num_hidden_layers=5)


def test_gradient_recipe_equals_whole_tensor_reference(tmp_path):
    """weighted-task-arithmetic with a gradient and filters, run from a recipe in a fresh process: θ = base +
    λ·Σ_t w_t(tensor)·(θ_t − base) in float32, rounded once to bfloat16, computed here tensor by tensor."""
    base, agents = make_models(tmp_path / "in", agents={"a": 0.5, "b": 0.55}, config=FIVE_LAYERS)
    grad = [0.0, 1.0, 0.5]
    filters = [{"filter": "mlp", "value": 2.0}, {"value": 0.25}]
    MergeSpec.build(
        str(base),
        [str(a) for a in agents],
        method="weighted-task-arithmetic",
        params={"weight": [grad, filters], "lambda": 0.5},
    ).save(tmp_path / "r.yaml")
    proc = subprocess.run(
        [sys.executable, "-m", "ram_desktop", "-q", "run", str(tmp_path / "r.yaml"), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    b, a0, a1, out = (ref.load_model(p) for p in (base, *agents, tmp_path / "out"))
    for name, x in b.items():
        layer = int(name.split("layers.")[1].split(".")[0]) if "layers." in name else None
        t = layer / 4 if layer is not None else 0.0
        w0 = (1 - (t * 2 - int(t * 2))) * grad[int(t * 2)] + (t * 2 - int(t * 2)) * grad[min(2, int(t * 2) + 1)]
        w1 = 2.0 if "mlp" in name else 0.25
        x32 = x.float()
        d0, d1 = a0[name].float() - x32, a1[name].float() - x32
        mixed = (d0 * torch.tensor(w0, dtype=torch.float32) + d1 * torch.tensor(w1, dtype=torch.float32)) * 0.5
        expected = (x32 + mixed).to(x.dtype)
        assert torch.equal(out[name].view(torch.int16), expected.view(torch.int16)), name


@pytest.mark.parametrize(
    "method,extra", [("della", {"epsilon": 0.1}), ("weighted-dare-ties", {}), ("weighted-dare-linear", {})]
)
def test_random_methods_deterministic_for_a_seed_and_keep_the_share(tmp_path, method, extra):
    """Two runs with one seed give the same bytes, another seed other bytes; without rescale and with weight 1
    the kept share of each task vector's updated elements is the density in expectation."""
    from ram_desktop.core import pipeline

    base, agents = make_models(tmp_path / "in", agents={"a": 0.5, "b": 0.55}, dtype=torch.float32)
    density = 0.3
    params = {"density": density, "rescale": False, "seed": 7, **extra}
    outs = []
    for i, seed in enumerate((7, 7, 8)):
        request = pipeline.MergeSpec.build(
            str(base),
            [str(a) for a in agents],
            tmp_path / f"o{i}",
            method,
            get_method(method).resolve(dict(params, seed=seed)),
            out_dtype="float32",
        )
        pipeline.merge(request)
        outs.append(ref.load_model(tmp_path / f"o{i}"))
    assert all(torch.equal(outs[0][k], outs[1][k]) for k in outs[0])
    assert any(not torch.equal(outs[0][k], outs[2][k]) for k in outs[0])
    if method == "weighted-dare-linear":  # θ = base + Σ kept τ_t: count the kept elements of agent a alone
        request = pipeline.MergeSpec.build(
            str(base),
            [str(agents[0])],
            tmp_path / "single",
            method,
            get_method(method).resolve(params),
            out_dtype="float32",
        )
        pipeline.merge(request)
        single, b, a = ref.load_model(tmp_path / "single"), ref.load_model(base), ref.load_model(agents[0])
        updated = sum(int((a[k] != b[k]).sum()) for k in b)
        kept = sum(int(((single[k] != b[k]) & (a[k] != b[k])).sum()) for k in b)
        share = kept / updated
        assert abs(share - density) < 4 * (density * (1 - density) / updated) ** 0.5, (share, updated)


def test_setting_value_is_what_one_tensor_name_gets():
    """``setting_value`` (the window's filters editor shows it): the first matching filter, its gradient at the
    tensor's layer position (layer i of 5: i/4), the default where no filter matches."""
    from ram_desktop.core import setting_value

    setting = [{"filter": "mlp", "value": [0.0, 1.0]}, {"filter": "*", "value": 0.5}]
    assert setting_value(setting, "model.layers.1.mlp.up_proj.weight", 5) == 0.25
    assert setting_value(setting, "model.layers.3.mlp.up_proj.weight", 5) == 0.75
    assert setting_value(setting, "model.embed_tokens.weight", 5) == 0.5
    assert setting_value(setting[:1], "lm_head.weight", 5, default=2.0) == 2.0
    assert setting_value(setting[:1], "lm_head.weight", 5) is None
    assert setting_value([1.0, 3.0], "model.layers.2.self_attn.q_proj.weight", 5) == 2.0
    assert setting_value(0.3, "anything", 0) == 0.3
