"""The window's session model holds what the panels share (issue 48, item 4): each value written once, each
watcher told with the new value, no Qt needed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ram_desktop.core import Agent, InputError, MergeSpec
from ram_desktop.gui.draft import Draft, draft_of_spec, merge_spec
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
        Topic.DRAFT: [],  # written by set_draft only (its own test)
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


# ---- the draft: what the method form shows, and the spec made from the session alone --------------------------

SOURCES = SourcesState("/m/base", (SourceRow(7, "coder", "/m/coder", 0), SourceRow(3, "tool", "/m/tool", 1)), True)


def test_a_draft_and_the_sources_make_the_spec_each_agent_with_its_own_values():
    draft = Draft(
        method="weighted-task-arithmetic",
        params={"weight": 1.0},  # a per-agent setting's value while no row is filled
        per_agent={"weight": {3: 0.25, 7: [0.2, 0.9]}},  # by row key
        eps=" 1e-4 ",
        device="cpu",
        out_dtype="float32",
        shard_size="",
        output=" /out/merged ",
        vocab="common",
        tokenizer={"source": "union"},
    )
    spec = merge_spec(SOURCES, draft)
    assert spec.base == "/m/base" and spec.method == "weighted-task-arithmetic"
    assert [(a.name, a.source, dict(a.params)) for a in spec.agents] == [
        ("coder", "/m/coder", {"weight": [0.2, 0.9]}),
        ("tool", "/m/tool", {"weight": 0.25}),
    ]
    assert dict(spec.params) == {}  # every agent has its own weight
    assert (spec.eps, spec.device, spec.out_dtype, spec.shard_size, spec.output, spec.vocab) == (
        1e-4,
        "cpu",
        "float32",
        "5GB",  # none typed: the default
        "/out/merged",
        "common",
    )
    assert spec.tokenizer == {"source": "union"}
    # no row filled: the value for every agent
    empty = merge_spec(SOURCES, draft.edited(per_agent={"weight": {}}))
    assert dict(empty.params) == {"weight": 1.0} and all(not a.params for a in empty.agents)


def test_per_agent_values_follow_their_agents_through_reorder_and_rename():
    draft = Draft(method="fisher", per_agent={"suite": {7: "/s/coder.jsonl", 3: "/s/tool.jsonl"}})
    moved = SourcesState(SOURCES.base, (SourceRow(3, "tools", "/m/tool", 1), SourceRow(7, "coder", "/m/coder", 0)))
    spec = merge_spec(moved, draft)
    assert [(a.name, a.params["suite"]) for a in spec.agents] == [
        ("tools", "/s/tool.jsonl"),
        ("coder", "/s/coder.jsonl"),
    ]
    # a removed agent's value goes with it
    (only,) = merge_spec(SourcesState(SOURCES.base, moved.agents[1:]), draft).agents
    assert (only.name, only.params["suite"]) == ("coder", "/s/coder.jsonl")


def test_the_spec_refuses_what_the_window_refuses_in_the_same_words():
    with pytest.raises(InputError, match=r"threshold ε 'abc' is not a non-negative number; write it like 1e-5"):
        merge_spec(SOURCES, Draft(eps="abc"))  # kept as typed in the draft until a spec is needed
    sliced = {"sources": [{"model": 0, "layer_range": [0, 2]}, {"model": 1, "layer_range": [0, 2]}]}
    one = SourcesState(SOURCES.base, SOURCES.agents[:1])
    mapped = MergeSpec(base=SOURCES.base, agents=merge_spec(one, Draft()).agents, method="linear", slices=(sliced,))
    draft = draft_of_spec(mapped, one.identities, Draft())
    assert merge_spec(one, draft).slices == (sliced,)
    with pytest.raises(InputError, match="The layer map merges the same models in every slice, without tool"):
        merge_spec(SOURCES, draft)  # tool added: the map does not read it
    with pytest.raises(InputError, match="The layer map reads coder, no longer among the agents"):
        merge_spec(SourcesState(SOURCES.base, SOURCES.agents[1:]), draft)


def test_a_spec_shown_as_a_draft_gives_the_same_spec_back():
    spec = merge_spec(SOURCES, Draft(method="fisher", per_agent={"suite": {7: "/s/c.jsonl"}}, eps="0.001"))
    draft = draft_of_spec(spec, SOURCES.identities, Draft())
    assert draft.per_agent["suite"] == {7: "/s/c.jsonl"} and draft.eps == "0.001"
    assert merge_spec(SOURCES, draft) == spec


def test_the_same_draft_twice_tells_nobody_and_a_watcher_hears_the_newest():
    s = Session()
    heard: list = []
    s.watch(Topic.DRAFT, heard.append)
    s.set_draft(Draft())  # what the session holds already
    assert heard == []
    s.set_draft(Draft(eps="1e-4"))
    s.set_draft(Draft(eps="1e-4"))
    assert heard == [Draft(eps="1e-4")] and s.draft.eps == "1e-4"
    # a watcher that completes a draft writes a newer one: the watchers after it hear only the newer one
    s2 = Session()
    s2.watch(Topic.DRAFT, lambda d: s2.set_draft(d.edited(output="/out")) if not d.output else None)
    later: list = []
    s2.watch(Topic.DRAFT, later.append)
    s2.set_draft(Draft(eps="0.1"))
    assert later == [Draft(eps="0.1", output="/out")] and s2.draft == later[0]
