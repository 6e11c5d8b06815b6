"""The window's session model (Qt-free): a change marks stale exactly what INVALIDATES says, only parts held,
and tells its listeners (issue 47)."""

from __future__ import annotations

from ram_desktop.gui.session import INVALIDATES, Change, Part, Session


def _all_made() -> Session:
    s = Session()
    for part in Part:
        s.made(part)
    return s


def test_each_change_marks_stale_exactly_what_it_invalidates():
    for change, parts in INVALIDATES.items():
        s = _all_made()
        assert s.changed(change) == list(parts)
        assert set(s.stale_parts()) == set(parts), change
    assert INVALIDATES[Change.METHOD] == (Part.RESULT, Part.COMPARE)  # the analysis measured the sources only
    assert INVALIDATES[Change.MERGE] == (Part.SCORES,)


def test_only_held_parts_go_stale_and_listeners_hear_it():
    s = Session()
    heard = []
    s.subscribe(lambda part, reason: heard.append((part, reason)))
    s.made(Part.ANALYSIS)
    assert s.changed(Change.SOURCES) == [Part.ANALYSIS]
    assert s.stale(Part.RESULT) is None and not s.held(Part.RESULT)
    assert heard[-1] == (Part.ANALYSIS, "The sources changed since this analysis")
    s.made(Part.ANALYSIS)
    assert s.stale(Part.ANALYSIS) is None and heard[-1] == (Part.ANALYSIS, None)


def test_the_session_model_needs_no_qt():
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['PySide6'] = None\n"
        "from ram_desktop.gui.session import Session, Part, Change\n"
        "s = Session(); s.made(Part.RESULT); assert s.changed(Change.METHOD) == [Part.RESULT]"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
