"""The panels observe one session model (issue 48, item 4): what the Sources step writes reaches the method
form and Evaluate through the session alone, and Compare and Search score with the settings Evaluate writes
there — no panel reads another's widgets. The method form edits the session's draft (``Topic.DRAFT``): a draft
written to the session alone is what the form shows and what a merge or a saved recipe uses."""

from __future__ import annotations

import pytest
import yaml

from ram_desktop.core import InputError
from ram_desktop.gui.session import ModelEntry, SourceRow, SourcesState, Topic

from .conftest import load_sources


def test_the_method_form_and_evaluate_follow_the_sessions_sources(qtbot, window):
    window.method.set_method("fisher")  # per-agent calibration suites: one row per agent
    state = SourcesState(
        "/models/base", (SourceRow(11, "coder", "/models/coder", 0), SourceRow(12, "tool", "/models/tool", 1)), False
    )
    window.session.set_sources(state)  # no row of the Sources step was touched
    field = window.method.fields["suite"].widget
    assert [e.objectName() for e in field.edits] == ["param_suite_0", "param_suite_1"]
    field.edits[1].setText("/suites/tool.jsonl")
    listed = [window.evaluate.model_list.item(i).text() for i in range(window.evaluate.model_list.count())]
    assert [t.split()[0] for t in listed] == ["base", "coder", "tool"], listed
    # reordered: the value stays with its agent (by key), Evaluate lists the new order
    window.session.set_sources(SourcesState(state.base, state.agents[::-1], False))
    assert [e.text() for e in field.edits] == ["/suites/tool.jsonl", ""]
    listed = [window.evaluate.model_list.item(i).text() for i in range(window.evaluate.model_list.count())]
    assert [t.split()[0] for t in listed] == ["base", "tool", "coder"], listed


def test_a_model_offered_to_the_session_is_listed_for_scoring(qtbot, window, tmp_path):
    window.session.offer_model(ModelEntry("variant-a", str(tmp_path / "variant-a"), "variant"))
    listed = [window.evaluate.model_list.item(i).text() for i in range(window.evaluate.model_list.count())]
    assert any(t.startswith("variant-a") for t in listed), listed


def test_compare_and_search_score_with_evaluates_settings_through_the_session(qtbot, window):
    window.evaluate.batch_size.setValue(3)
    window.evaluate.limit.setValue(5)
    assert (window.session.scoring.batch_size, window.session.scoring.limit) == (3, 5)
    window.evaluate.limit.setValue(0)  # "all"
    assert window.session.scoring.limit is None
    assert window.compare.summary.text() == "No suite ticked in Evaluate: the variants are merged, not scored."


def test_a_draft_written_to_the_session_alone_is_what_the_form_shows_and_a_merge_and_save_use(
    qtbot, window, demo_models, tmp_path
):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents[:2])
    (first, _), (second, _) = window.session.sources.identities
    draft = window.session.draft.with_method("fisher", {"examples": 300}, window.session.sources.identities)
    draft = draft.edited(
        per_agent={"suite": {second: "/suites/second.jsonl", first: "/suites/first.jsonl"}},
        eps="0.001",
        out_dtype="float32",
        vocab="common",
        device="cpu",
        shard_size="2GB",
        output=str(tmp_path / "merged"),
    )
    window.session.set_draft(draft)  # no widget touched
    m = window.method
    assert m.current.name == "fisher" and m.fields["examples"].value() == 300
    assert [e.text() for e in m.fields["suite"].widget.edits] == ["/suites/first.jsonl", "/suites/second.jsonl"]
    assert (m.eps.text(), m.out_dtype.currentData(), m.vocab.currentData(), m.device.currentData()) == (
        "0.001",
        "float32",
        "common",
        "cpu",
    )
    assert (m.shard_size.text(), m.out_dir.text()) == ("2GB", str(tmp_path / "merged"))
    held = window.session.draft  # as the form reads it back: completed with the method's other defaults
    assert held.params["examples"] == 300 and held.params["scale"] == 1.0
    assert held.per_agent["suite"] == {first: "/suites/first.jsonl", second: "/suites/second.jsonl"}
    assert held.edited(params=draft.params, per_agent=draft.per_agent) == draft
    spec = window.spec()  # what Merge, Analyze, Compare and Search run
    assert (spec.method, spec.eps, spec.out_dtype, spec.vocab, spec.device) == (
        "fisher",
        0.001,
        "float32",
        "common",
        "cpu",
    )
    assert [dict(a.params) for a in spec.agents] == [
        {"suite": "/suites/first.jsonl"},
        {"suite": "/suites/second.jsonl"},
    ]
    assert window.save_recipe(tmp_path / "recipe.yaml"), window.message.text.text()
    saved = yaml.safe_load((tmp_path / "recipe.yaml").read_text())
    assert (saved["method"], saved["eps"], saved["output"]) == ("fisher", 0.001, str(tmp_path / "merged"))
    assert saved["parameters"]["suite"] == {"coder": "/suites/first.jsonl", "tool": "/suites/second.jsonl"}


def test_editing_the_form_writes_the_sessions_draft(qtbot, window):
    state = SourcesState("/models/base", (SourceRow(11, "coder", "/m/c", 0), SourceRow(12, "tool", "/m/t", 1)), False)
    window.session.set_sources(state)
    heard: list = []

    window.session.watch(Topic.DRAFT, heard.append)
    window.method.set_method("fisher")
    assert window.session.draft.method == "fisher"
    window.method.fields["suite"].widget.edits[1].setText("/suites/tool.jsonl")
    assert window.session.draft.per_agent["suite"] == {12: "/suites/tool.jsonl"}  # by the row's key
    window.method.vocab.setCurrentIndex(window.method.vocab.findData("common"))
    window.method.out_dir.setText("/out/here")
    assert (window.session.draft.vocab, window.session.draft.output) == ("common", "/out/here")
    # invalid text stays as typed, in the field and the draft; the spec refuses it in today's words
    window.method.eps.setText("abc")
    assert window.method.eps.text() == "abc" and window.session.draft.eps == "abc"
    with pytest.raises(InputError, match="threshold ε 'abc' is not a non-negative number"):
        window.spec()
    assert heard and heard[-1] == window.session.draft
    count = len(heard)
    window.method.eps.setText("abc")  # the same text: the same draft, nobody told
    assert len(heard) == count
    # reordered: the value stays with its agent, in the form and the spec
    window.session.set_sources(SourcesState(state.base, state.agents[::-1], False))
    assert [e.text() for e in window.method.fields["suite"].widget.edits] == ["/suites/tool.jsonl", ""]
    window.method.eps.setText("1e-5")
    assert [(a.name, dict(a.params)) for a in window.spec().agents] == [
        ("tool", {"suite": "/suites/tool.jsonl"}),
        ("coder", {}),
    ]
