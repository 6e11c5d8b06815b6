"""Adding a method is one module in ``core/methods/`` and one line in the registry: a throwaway method
registered at test time appears in the CLI's flags, the GUI form, a recipe round trip, the comparison's
sweep, would-keep and mergekit export (mapped, or refused with a clear message); and the modules that
read a method's fields name no method."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest
import yaml

from ram_desktop.core import MergeSpec, RunOptions, pipeline
from ram_desktop.core.errors import InputError
from ram_desktop.core.methods import (
    METHODS,
    SEARCH_METHODS,
    SEARCH_REFERENCES,
    Analysis,
    Interop,
    MergeMethod,
    Param,
    Streaming,
    Sweep,
    WouldKeep,
)
from ram_desktop.core.methods.mergekit_map import MergekitExport, MergekitImport, MergekitMapping, unit_weights

PACKAGE = Path(__file__).resolve().parents[1] / "ram_desktop"
NAME, REFUSED = "half-sum", "half-sum-local"
WEIGHT = Param("weight", float, 0.5, "factor w of the summed task vectors", 0.0, 4.0)


def _merge(chunk, ctx: dict):
    return chunk.taus.sum(0) * ctx["weight"]


def _shares(report, params: dict) -> list[float]:
    return [a.updated * params["weight"] for a in report.agents]


def _export(params: dict, eps: float) -> MergekitExport:
    return MergekitExport(
        "task_arithmetic",
        {"lambda": params["weight"]},
        {"weight": 1.0},
        ["half-sum is task arithmetic with lambda = w"],
    )


def _import(given) -> tuple[str, dict]:
    return NAME, {"weight": unit_weights(given)}


THROWAWAY = MergeMethod(
    NAME,
    "Half sum",
    "θ_pre + w·Σ task vectors (a test method).",
    (WEIGHT,),
    _merge,
    short="Half",
    streaming=Streaming(thread_safe=True),
    analysis=Analysis(would_keep=WouldKeep(_shares)),
    interop=Interop(
        sweep=Sweep("weight", "0.25, 0.75"),
        mergekit=MergekitMapping(_export, (MergekitImport("half_sum", {"lambda": 1.0}, {"weight": None}, _import),)),
    ),
)
NOT_IN_MERGEKIT = MergeMethod(REFUSED, "Half sum (local)", "The same, unknown to mergekit.", (WEIGHT,), _merge)


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(METHODS, NAME, THROWAWAY)
    monkeypatch.setitem(METHODS, REFUSED, NOT_IN_MERGEKIT)


def test_cli_flags_and_help_name_it(registered, capsys):
    from ram_desktop.cli import build_parser, main

    args = build_parser().parse_args(["merge", "base", "a1", "a2", "--out", "o", "--method", NAME, "--weight", "0.3"])
    assert args.method == NAME and args.param_weight == 0.3
    with pytest.raises(SystemExit):
        main(["merge", "--help"])
    text = capsys.readouterr().out
    assert NAME in text and "--weight" in text and "factor w of the summed task vectors" in text


def test_merge_and_recipe_round_trip(registered, models, tmp_path):
    """The engine merges with it (torch path: it has no fused kernel) and the written recipe reads back."""
    from ram_desktop.core import MergeSpec

    base, agents = models
    out = tmp_path / "out"
    result = pipeline.merge(
        pipeline.MergeSpec.build(
            str(base), [str(a) for a in agents], out, NAME, {"weight": 0.25}, device="cpu", out_dtype="float32"
        ),
        options=pipeline.RunOptions(use_cache=False),
    )
    assert result.report["method"] == NAME and result.report["method_params"] == {"weight": 0.25}
    recipe = MergeSpec.load(out / "ram-recipe.yaml")
    assert (recipe.method, recipe.params) == (NAME, {"weight": 0.25})
    again = MergeSpec.from_dict(yaml.safe_load(recipe.to_yaml()))
    assert (again.method, again.params) == (NAME, {"weight": 0.25})
    assert again == recipe


def test_would_keep_and_the_chart_show_it(registered, models, qtbot):
    pytest.importorskip("pyqtgraph")
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from ram_desktop.core.methods.would_keep import estimated, keep_methods, would_keep
    from ram_desktop.gui.analysis.inspect_charts import WouldKeepChart

    base, agents = models
    report = pipeline.probe(
        MergeSpec.build(str(base), [str(a) for a in agents], device="cpu"), RunOptions(use_cache=False)
    )
    assert NAME in keep_methods() and REFUSED not in keep_methods() and not estimated(NAME)
    assert would_keep(report, NAME, {"weight": 0.75}) == [0.75 if a.updated else None for a in report.agents]
    chart = WouldKeepChart()
    qtbot.addWidget(chart)
    chart.set_method(NAME, {"weight": 2.0})
    chart.show_report(report)
    assert chart.values[NAME] == would_keep(report, NAME, {"weight": 2.0})
    ticks = chart.plot.getAxis("bottom")._tickLevels[0]
    assert "Half" in [label for _, label in ticks]


def test_gui_form_builds_its_fields(registered, qtbot):
    pytest.importorskip("PySide6")
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from ram_desktop.gui.method.panel import MethodPanel

    panel = MethodPanel()
    qtbot.addWidget(panel)
    panel.set_method(NAME, {"weight": 1.5})
    assert panel.current is THROWAWAY
    assert set(panel.fields) == {"weight"} and panel.params() == {"weight": 1.5}


def test_comparison_offers_its_sweep(registered, qtbot):
    pytest.importorskip("PySide6")
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from ram_desktop.gui.evaluate.compare_panel import MethodRow

    row = MethodRow(NAME)
    qtbot.addWidget(row.check)
    assert row.param.currentData() == "weight" and row.values.text() == "0.25, 0.75"
    row.check.setChecked(True)
    assert [(v.method, v.params) for v in row.variants()] == [(NAME, {"weight": "0.25"}), (NAME, {"weight": "0.75"})]
    other = MethodRow(REFUSED)  # no sweep declared: its first parameter at its default
    qtbot.addWidget(other.check)
    assert other.param.currentData() == "weight" and other.values.text() == "0.5"


def test_mergekit_export_maps_it_or_refuses_it(registered):
    from ram_desktop.core.ecosystem.mergekit import from_mergekit, to_mergekit

    text = to_mergekit(MergeSpec.build("base", ["a1", "a2"], method=NAME, params={"weight": 0.3}, out_dtype="float32"))
    data = yaml.safe_load(text)
    assert data["merge_method"] == "task_arithmetic" and data["parameters"] == {"lambda": 0.3}
    assert "# - half-sum is task arithmetic" in text
    back = from_mergekit(
        {
            "merge_method": "half_sum",
            "base_model": "base",
            "parameters": {"lambda": 0.3},
            "models": [{"model": "a1", "parameters": {"weight": 1.0}}, {"model": "a2", "parameters": {"weight": 1.0}}],
        }
    )
    assert (back.spec.method, back.spec.params) == (NAME, {"weight": 0.3})
    with pytest.raises(InputError, match=f"method {REFUSED} has no mergekit equivalent"):
        to_mergekit(MergeSpec.build("base", ["a1", "a2"], method=REFUSED, params={}))


READERS = [
    "core/engine/passes.py",
    "core/methods/would_keep.py",
    "core/ecosystem/mergekit.py",
    "core/engine/kernels.py",
    "gui/evaluate/compare_panel.py",
    "gui/analysis/inspect_charts.py",
    "evaluate/search.py",  # the methods it tries by default and its references are the methods' own flags
]


@pytest.mark.parametrize("module", READERS)
def test_modules_that_read_method_fields_name_no_method(module):
    """No registered method's name as a string literal: they read the method's fields instead."""
    tree = ast.parse((PACKAGE / module).read_text(encoding="utf-8"))
    named = sorted(
        {
            f"{node.value!r} (line {node.lineno})"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in METHODS
        }
    )
    assert not named, f"{module} names methods: {', '.join(named)}"


def test_the_searchs_methods_are_the_methods_flags():
    """``SEARCH_METHODS`` and ``SEARCH_REFERENCES`` are derived from each method's ``Interop`` flags
    (``searched_by_default``, ``search_reference``): every name is a registered method, the flagged ones and no
    other, in the order a study records (the default method first, then the registry's)."""
    from ram_desktop.core import defaults

    flagged = [name for name, m in METHODS.items() if m.interop.searched_by_default]
    assert set(SEARCH_METHODS) <= set(METHODS) and sorted(SEARCH_METHODS) == sorted(flagged)
    assert SEARCH_METHODS == (defaults.METHOD, *(n for n in flagged if n != defaults.METHOD))
    # the order study.db files made with the default methods recorded (evaluate.search._identity)
    assert SEARCH_METHODS == ("ram-plus", "ram", "average", "task-arithmetic", "ties", "dare-ta", "dare-ties")
    references = tuple((name, m.label) for name, m in METHODS.items() if m.interop.search_reference)
    assert SEARCH_REFERENCES == references == (("ram-plus", "RAM+"), ("task-arithmetic", "Task Arithmetic"))
    for name in SEARCH_METHODS:  # what the window's Search offers: no stacking, no calibration data needed
        assert not METHODS[name].streaming.stacks and not METHODS[name].interop.calibrated, name
