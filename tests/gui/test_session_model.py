"""The panels observe one session model (issue 48, item 4): what the Sources step writes reaches the method
form and Evaluate through the session alone, and Compare and Search score with the settings Evaluate writes
there — no panel reads another's widgets."""

from __future__ import annotations

from ram_desktop.gui.session import ModelEntry, SourceRow, SourcesState


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
