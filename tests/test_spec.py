"""``MergeSpec``: one frozen description of a merge; per-agent values on their agents through every change of
the agents, a comparison's variants and the recipe file (pure checks, no model read)."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from ram_desktop import core
from ram_desktop.core import Agent, InputError, MergeSpec, Variant, variant_specs


def _spec() -> MergeSpec:
    return MergeSpec.build(
        "base",
        ["/m/coder", "/m/tool", "/m/memory"],
        "/out",
        method="weighted-ties",
        params={"weight": [0.1, 0.2, 0.3], "density": "0.5,0.7,0.9", "lambda": 1.0},
    )


def test_one_class_describes_a_merge():
    for gone in ("Session", "Recipe", "MergeRequest", "VariantSpec"):
        assert not hasattr(core, gone), gone
    spec = _spec()
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.method = "ram"  # type: ignore[misc]
    assert spec.names == ["coder", "tool", "memory"]
    assert [a.params for a in spec.agents] == [
        {"weight": 0.1, "density": "0.5"},
        {"weight": 0.2, "density": "0.7"},
        {"weight": 0.3, "density": "0.9"},
    ]
    assert spec.params == {"lambda": 1.0}
    assert spec.engine_params()["weight"] == [0.1, 0.2, 0.3]


def test_removing_reordering_and_renaming_agents_keep_each_agents_values():
    spec = _spec()
    _, tool, memory = spec.agents
    fewer = spec.with_agents([memory, tool])
    assert fewer.engine_params()["weight"] == [0.3, 0.2]
    renamed = fewer.with_agents([memory, dataclasses.replace(tool, name="tools")])
    assert renamed.engine_params()["weight"] == [0.3, 0.2] and renamed.names == ["memory", "tools"]
    more = fewer.with_agents([memory, tool, Agent("new", "/m/new")])
    with pytest.raises(InputError):  # a setting's missing value takes the default; weights here are given for all
        more.with_agents([memory, memory])
    assert more.engine_params()["weight"] == [0.3, 0.2, None]


def test_the_recipe_keys_values_by_name_and_reads_back():
    spec = _spec().resolved()
    data = yaml.safe_load(spec.to_yaml())
    assert data["format"] == "ram-recipe/2"
    assert data["parameters"]["weight"] == {"coder": 0.1, "tool": 0.2, "memory": 0.3}
    assert data["agents"][0] == {"name": "coder", "source": "/m/coder"}
    assert MergeSpec.from_yaml(spec.to_yaml()) == spec
    data["agents"] = data["agents"][::-1]  # another order: each agent keeps its values
    again = MergeSpec.from_dict(data)
    assert again.engine_params()["weight"] == [0.3, 0.2, 0.1]


@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"weight": {"coder": 0.1, "nobody": 0.2}}, "parameters.weight.nobody: no agent of that name"),
        ({"fisher": ["/f/a", "/f/b", "/f/c"]}, "a parameter of fisher"),
    ],
)
def test_a_bad_keyed_value_is_refused_naming_it(change, fragment):
    data = yaml.safe_load(_spec().resolved().to_yaml())
    data["parameters"].update(change)
    with pytest.raises(InputError, match=fragment):
        MergeSpec.from_dict(data, "r.yaml")


def test_a_v1_recipe_maps_its_lists_by_position():
    data = {
        "format": "ram-recipe/1",
        "method": "della",
        "base": "b",
        "agents": [{"name": "x", "source": "/m/a"}, {"name": "y", "source": "/m/b"}],
        "parameters": {"density": [0.4, 0.6]},
    }
    spec = MergeSpec.from_dict(data)
    assert [(a.name, a.params) for a in spec.agents] == [("x", {"density": 0.4}), ("y", {"density": 0.6})]
    data["agents"] = ["/m/a", {"source": "/m/b", "name": "y"}]  # not every agent named: all derived, as before
    spec = MergeSpec.from_dict(data)
    assert [(a.name, a.params) for a in spec.agents] == [("a", {"density": 0.4}), ("b", {"density": 0.6})]
    data["parameters"]["density"] = [0.4]
    with pytest.raises(InputError, match="1 values for 2 agents"):
        MergeSpec.from_dict(data)


def test_a_variant_is_a_spec_delta_keyed_by_agent(tmp_path):
    shared = _spec()
    one = Variant.parse("weighted-ties:weight.tool=0.9,name=tool-up")
    two = Variant.parse("linear:name=lin")
    specs = variant_specs(shared, [one, two], tmp_path)
    assert [a.params["weight"] for a in specs[0].agents] == [0.1, "0.9", 0.3]
    assert specs[0].output == str(tmp_path / "tool-up") and specs[0].names == shared.names
    assert specs[0].sources == shared.sources
    assert specs[1].method == "linear" and specs[1].engine_params()["weight"] == [0.1, 0.2, 0.3]
    with pytest.raises(InputError, match="nobody"):
        variant_specs(shared, [Variant.parse("weighted-ties:weight.nobody=1")], tmp_path)


def test_no_agents_and_no_output_are_one_error_each_with_one_message(tmp_path):
    """A spec without agents, or without an output folder, is refused with one error class and one message by
    every step (the merge, a comparison's variants, the search, the engine's own plan), each written once."""
    from pathlib import Path

    from ram_desktop import workflow
    from ram_desktop.core.errors import NoAgents, NoOutput
    from ram_desktop.evaluate.search import SearchOptions, search

    agentless = MergeSpec.build("/m/base", [], tmp_path / "out", method="ram")
    outless = MergeSpec.build("/m/base", ["/m/coder", "/m/tool"], None, method="ram")
    options = SearchOptions(agentless, ["/suites/code"], [], tmp_path / "search", 2, ["ram"], 0)
    cases = [
        (
            NoAgents,
            "no agents chosen; name at least one agent fine-tuned from the base",
            agentless,
            [
                agentless.check_agents,
                lambda: workflow.check_ready(agentless),
                lambda: core.merge_variants([agentless]),
                lambda: search(options),
            ],
        ),
        (
            NoOutput,
            "no output folder chosen; pass --out DIR (or choose one in the window)",
            outless,
            [
                outless.check_output,
                lambda: workflow.check_ready(outless),
                lambda: core.merge_variants([outless]),
            ],
        ),
    ]
    package = Path(core.__file__).resolve().parents[1]
    for error, text, _, steps in cases:
        for step in steps:
            with pytest.raises(error) as raised:
                step()
            assert isinstance(raised.value, InputError) and str(raised.value) == text
        written = [p.name for p in package.rglob("*.py") if text.split(";")[0] in p.read_text()]
        assert written == ["errors.py"], (text, written)
    _spec().check_agents()
    _spec().check_output()


def test_no_base_is_one_error_with_one_message(tmp_path):
    """Every step that needs a base refuses a spec without one through ``MergeSpec.check_base``: one error class
    (an ``InputError``), one message, written once in the package."""
    from pathlib import Path

    from ram_desktop import workflow
    from ram_desktop.core.errors import NoBase

    text = "no base model chosen; name the base the agents were fine-tuned from"
    baseless = MergeSpec.build("", ["/m/coder", "/m/tool"], tmp_path / "out", method="ram")
    for step in (baseless.check_base, lambda: workflow.check_ready(baseless), lambda: core.merge_variants([baseless])):
        with pytest.raises(NoBase) as raised:
            step()
        assert isinstance(raised.value, InputError) and str(raised.value) == text
    _spec().check_base()  # a base chosen: nothing raised
    package = Path(core.__file__).resolve().parents[1]
    written = [p.name for p in package.rglob("*.py") if "no base model chosen" in p.read_text()]
    assert written == ["errors.py"], written
