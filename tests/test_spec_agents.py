"""The recipe file a spec writes, byte for byte, and a spec's values: each agent's own on its ``Agent``, every
mapping in a spec read-only. The expected texts are what the spec of commit d1189d2 (values keyed in
``MergeSpec.params``) wrote for these recipes."""

from __future__ import annotations

import copy
import operator
import pickle

import pytest

from ram_desktop.core import MergeSpec
from ram_desktop.core.ecosystem.mergekit import load_mergekit
from ram_desktop.core.spec import Agent

# weighted TIES: a per-agent setting with a gradient for one agent, filters for another; shared values
TIES = """\
# RAM Desktop merge recipe. Reproduce with: ram-merge run ram-recipe.yaml [--out DIR]
format: ram-recipe/2
method: weighted-ties
parameters:
  weight:
    coder: 0.1
    tool:
    - 0.2
    - 0.4
  density:
    coder:
    - filter: mlp
      value: 0.5
    - value: 0.6
    tool: 0.7
  lambda: 0.9
  normalize: true
eps: 1.0e-05
base: /m/base
agents:
- name: coder
  source: /m/coder
- name: tool
  source: /m/tool
out_dtype: base
shard_size: 5GB
device: auto
"""

# DELLA: settings given once (a gradient, one filter mapping), per-agent epsilon, a tokenizer, a layer map
ONCE = """\
# RAM Desktop merge recipe. Reproduce with: ram-merge run ram-recipe.yaml [--out DIR]
format: ram-recipe/2
method: della
parameters:
  weight:
  - 0.1
  - 0.9
  density:
    filter: self_attn
    value: 0.3
  epsilon:
    a1: 0.01
    a2: 0.02
eps: 1.0e-05
base: /m/base
agents:
- name: a1
  source: /m/a1
- name: a2
  source: /m/a2
out_dtype: base
shard_size: 5GB
device: auto
tokenizer:
  source: union
  tokens:
    <tool>:
      source: a1
slices:
- sources:
  - model: 0
    layer_range:
    - 0
    - 2
  - model: 1
    layer_range:
    - 0
    - 2
  - model: 2
    layer_range:
    - 0
    - 2
  parameters:
    weight:
      a1: 0.25
      a2: 0.75
"""

V1 = """\
format: ram-recipe/1
method: weighted-ties
parameters:
  weight: [0.1, 0.2]
  density: 0.5,0.7
  lambda: 1.0
base: /m/base
agents: [/m/coder, {name: t, source: /m/tool}]
"""

V1_UPGRADED = """\
# RAM Desktop merge recipe. Reproduce with: ram-merge run ram-recipe.yaml [--out DIR]
format: ram-recipe/2
method: weighted-ties
parameters:
  weight:
    coder: 0.1
    tool: 0.2
  density:
    coder: '0.5'
    tool: '0.7'
  lambda: 1.0
eps: 1.0e-05
base: /m/base
agents:
- name: coder
  source: /m/coder
- name: tool
  source: /m/tool
out_dtype: base
shard_size: 5GB
device: auto
"""


@pytest.mark.parametrize("text", [TIES, ONCE], ids=["ties", "once"])
def test_a_recipe_reads_and_writes_the_same_bytes(text, tmp_path):
    path = tmp_path / "ram-recipe.yaml"
    path.write_bytes(text.encode())
    spec = MergeSpec.load(path)
    spec.save(tmp_path / "again.yaml")
    assert (tmp_path / "again.yaml").read_bytes() == text.encode()
    assert MergeSpec.from_yaml(spec.to_yaml()) == spec


def test_a_v1_recipe_is_written_as_v2(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text(V1)
    assert MergeSpec.load(path).to_yaml() == V1_UPGRADED


def test_each_agent_carries_its_own_values():
    spec = MergeSpec.from_yaml(TIES)
    coder, tool = spec.agents
    assert coder.params == {"weight": 0.1, "density": [{"filter": "mlp", "value": 0.5}, {"value": 0.6}]}
    assert tool.params == {"weight": [0.2, 0.4], "density": 0.7}
    assert spec.params == {"lambda": 0.9, "normalize": True}
    once = MergeSpec.from_yaml(ONCE)
    assert once.params == {"weight": [0.1, 0.9], "density": {"filter": "self_attn", "value": 0.3}}
    assert [a.params for a in once.agents] == [{"epsilon": 0.01}, {"epsilon": 0.02}]
    engine = once.engine_params()
    assert engine == {
        "weight": [[0.1, 0.9], [0.1, 0.9]],
        "density": {"filter": "self_attn", "value": 0.3},
        "epsilon": [0.01, 0.02],
    }
    assert type(engine["weight"]) is list and type(engine["density"]) is dict  # the engine's plain values


def test_values_follow_their_agent_through_reorder_and_rename():
    spec = MergeSpec.from_yaml(TIES)
    coder, tool = spec.agents
    moved = spec.replace(agents=(Agent("tools", tool.source, tool.params), coder))
    assert moved.engine_params()["weight"] == [[0.2, 0.4], 0.1]
    assert moved.engine_params()["density"] == [0.7, [{"filter": "mlp", "value": 0.5}, {"value": 0.6}]]


def _mutations(spec):
    yield lambda: operator.setitem(spec.params, "lambda", 2.0)
    yield lambda: operator.setitem(spec.agents[0].params, "weight", 2.0)
    yield lambda: operator.setitem(spec.agents[0].params["density"][0], "value", 2.0)
    yield lambda: operator.setitem(spec.tokenizer, "source", "base")
    yield lambda: operator.setitem(spec.tokenizer["tokens"]["<tool>"], "source", "a2")
    yield lambda: operator.setitem(spec.slices[0], "parameters", {})
    yield lambda: operator.setitem(spec.slices[0]["sources"][0], "model", 1)
    yield lambda: operator.setitem(spec.slices[0]["parameters"]["weight"], "a1", 1.0)


def test_no_mapping_in_a_spec_can_be_changed():
    spec = MergeSpec.from_yaml(ONCE)
    spec = spec.replace(agents=(spec.agents[0].__class__("a1", "/m/a1", {"density": [{"value": 0.5}]}), spec.agents[1]))
    for change in _mutations(spec):
        with pytest.raises(TypeError):
            change()
    with pytest.raises(AttributeError):
        spec.agents[0].params["density"].append({"value": 0.1})


def test_a_spec_pickles_and_copies_to_an_equal_spec():
    spec = MergeSpec.from_yaml(ONCE)
    for again in (pickle.loads(pickle.dumps(spec)), copy.deepcopy(spec)):
        assert again == spec and again.to_yaml() == spec.to_yaml()
        assert again.engine_params() == spec.engine_params()


def test_a_mergekit_models_parameters_land_on_its_agent(tmp_path):
    config = tmp_path / "merge.yaml"
    config.write_text(
        "merge_method: ties\n"
        "base_model: /m/base\n"
        "parameters:\n  density: 0.2\n  normalize: false\n"
        "models:\n"
        "  - model: /m/a1\n    parameters:\n      weight: 0.3\n      density: 0.5\n"
        "  - model: /m/a2\n    parameters:\n      weight: [0.7, 0.1]\n"
    )
    spec = load_mergekit(config).spec
    assert [(a.name, a.params) for a in spec.agents] == [
        ("a1", {"weight": 0.3, "density": 0.5}),
        ("a2", {"weight": [0.7, 0.1], "density": 0.2}),  # the file's shared density as its fallback
    ]
    assert "weight" not in spec.params and "density" not in spec.params
    assert spec.engine_params()["weight"] == [0.3, [0.7, 0.1]]
