"""The Analysis step's "Which method?" view: after Analyze it shows each agent's deciding numbers and the
probe's advice, the same as ``ram-merge probe`` prints."""

from __future__ import annotations

from ram_desktop.core import advise

from .conftest import analyse, load_sources


def test_the_view_shows_the_probes_advice(qtbot, window, demo_models):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    analyse(qtbot, window)
    tabs = window.analysis.tabs
    index = next(i for i in range(tabs.count()) if tabs.tabText(i) == "Which method?")
    tabs.setCurrentIndex(index)
    text = window.analysis.which_method.text.text()
    advice = advise(window.analysis.report, "bfloat16")
    assert "Worth searching first:" in text and ", ".join(advice.methods) in text
    for agent in advice.agents:
        assert agent.name in text and f"{agent.density:.1%}" in text
    assert advice.findings and all(finding.replace("'", "&#x27;") in text for finding in advice.findings)
