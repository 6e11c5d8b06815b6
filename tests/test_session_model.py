"""The window's session model holds what the panels share (issue 48, item 4): each value written once, each
watcher told with the new value, no Qt needed."""

from __future__ import annotations

import subprocess
import sys

from ram_desktop.core import Agent
from ram_desktop.gui.session import ModelEntry, Scoring, Session, SourceRow, SourcesState, Topic


def test_each_topic_tells_its_watchers_the_new_value_and_only_them():
    s = Session()
    heard: dict[Topic, list] = {t: [] for t in Topic}
    for topic in Topic:
        s.watch(topic, heard[topic].append)
    sources = SourcesState("base", (SourceRow(7, "coder", "/m/coder", 0), SourceRow(3, "tool", "/m/tool", 1)), True)
    s.set_sources(sources)
    s.set_scoring(Scoring(("suite",), 4, 10))
    s.offer_model(ModelEntry("merged", "/out", "merged"))
    s.set_result("a result")
    s.set_scores("some scores")
    assert heard == {
        Topic.SOURCES: [sources],
        Topic.ANALYSIS: [],  # written by set_analysis only (its own test)
        Topic.SCORING: [Scoring(("suite",), 4, 10)],
        Topic.MODEL_OFFERED: [ModelEntry("merged", "/out", "merged")],
        Topic.RESULT: ["a result"],
        Topic.SCORES: ["some scores"],
    }
    assert (s.sources, s.scoring, s.result, s.scores) == (
        sources,
        Scoring(("suite",), 4, 10),
        "a result",
        "some scores",
    )
    s.set_scoring(Scoring(("suite",), 4, 10))  # the same settings again: nobody is told
    assert len(heard[Topic.SCORING]) == 1


def test_the_sources_state_says_what_a_spec_and_the_panels_take():
    state = SourcesState("b", (SourceRow(7, "coder", "/m/c", 2), SourceRow(3, "tool", "/m/t", 0)), False)
    assert state.chosen == ("b", (Agent("coder", "/m/c"), Agent("tool", "/m/t")))
    assert state.names == ["coder", "tool"]
    assert state.identities == [(7, "coder"), (3, "tool")]
    assert state.color_slots == {"coder": 2, "tool": 0}
    assert SourcesState().chosen == ("", ())


def test_the_session_model_runs_without_qt():
    code = (
        "import sys; sys.modules['PySide6'] = None\n"
        "from ram_desktop.gui.session import Session, SourcesState, Topic\n"
        "s = Session(); seen = []; s.watch(Topic.SOURCES, seen.append)\n"
        "s.set_sources(SourcesState('b')); assert seen == [SourcesState('b')]"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_an_analysis_written_is_fresh_a_relabelled_one_keeps_its_freshness_and_none_drops_it():
    from ram_desktop.gui.session import Change, Part

    s = Session()
    shown: list = []
    s.watch(Topic.ANALYSIS, shown.append)
    s.set_analysis("report", ("base", ("a",), "1e-5"))
    assert s.held(Part.ANALYSIS) and s.stale(Part.ANALYSIS) is None and s.analysis_key == ("base", ("a",), "1e-5")
    s.changed(Change.SOURCES)
    s.relabel_analysis("report, renamed")
    assert s.stale(Part.ANALYSIS) == "The sources changed since this analysis"  # still stale: same statistics
    s.set_analysis(None)
    assert not s.held(Part.ANALYSIS) and s.analysis_key is None
    assert shown == ["report", "report, renamed", None]
