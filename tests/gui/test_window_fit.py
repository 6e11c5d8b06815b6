"""The window fits a laptop screen: DELLA with three agents at 1360×860, a minimum size within 1366×768,
the Sources table keeping four rows, long banners capped behind Details…"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractButton, QAbstractSpinBox, QComboBox, QLineEdit

from .conftest import analyse, load_sources

# 1366×768 less a taskbar (40 px) and a title bar (30 px)
LAPTOP = (1366, 768 - 40 - 30)


def _fits(window) -> None:
    hint = window.minimumSizeHint()
    assert hint.width() <= LAPTOP[0] and hint.height() <= LAPTOP[1], hint.toTuple()


def _not_crushed(widget) -> None:
    """Every visible line edit and button in ``widget`` has at least the height it asks for."""
    for child in widget.findChildren(QLineEdit) + widget.findChildren(QAbstractButton):
        inner = isinstance(child.parent(), (QAbstractSpinBox, QComboBox))  # a spin box's own edit
        if child.isVisibleTo(widget) and not inner:
            assert child.height() >= child.minimumSizeHint().height(), (
                child.objectName(),
                type(child.parent()).__name__,
                child.text(),
                child.height(),
            )


def test_della_with_three_agents_fits_1360x860_without_crushing(qtbot, window, demo_models):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    window.resize(1360, 860)
    window.method.set_method("della")
    qtbot.wait(50)
    assert window.size().toTuple() == (1360, 860)  # the form did not push the window taller
    _fits(window)
    _not_crushed(window.method)
    edits = [e for e in window.method.findChildren(QLineEdit) if e.objectName().startswith("param_weight_")]
    assert len(edits) == 3 and all(e.height() >= e.sizeHint().height() for e in edits)


def test_minimum_size_fits_a_1366x768_laptop_with_every_method(qtbot, window, demo_models):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    for i in range(window.method.method.count()):
        window.method.method.setCurrentIndex(i)
        _fits(window)
    window.resize(*LAPTOP)
    qtbot.wait(200)  # the form's rows settle over a few turns of the event loop
    _not_crushed(window.method)


def test_switching_method_keeps_four_source_rows_in_view(qtbot, window, demo_models):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    window.resize(1366, 700)
    table = window.sources.table
    rows = table.rowCount()
    for name in ("della", "slerp", "fisher", "ram-plus"):
        window.method.set_method(name)
        qtbot.wait(20)
        visible = table.viewport().height() / table.rowHeight(0)
        assert visible >= min(rows, 4), (name, visible)
        # the buttons below the table sit below it, never over it
        assert window.sources.remove_button.mapTo(
            window.sources, window.sources.remove_button.rect().topLeft()
        ).y() >= (table.geometry().bottom())


def test_a_long_banner_is_capped_with_details(qtbot, window):
    window.resize(1360, 700)
    before = window.minimumSizeHint().height()
    names = ", ".join(f"model.layers.{i}.self_attn.q_proj.weight" for i in range(40))
    window.show_warning(f"40 tensors are not in every agent: {names}; they keep the base's values")
    qtbot.wait(20)
    assert window.minimumSizeHint().height() - before <= 60
    bar = window.message
    assert bar.details_button.isVisible() and names not in bar.text.displayed()
    qtbot.mouseClick(bar.details_button, Qt.LeftButton)
    assert names in bar.details.toPlainText()
    assert window.height() <= 700


def test_scoring_steps_take_the_result_box_height_on_a_laptop(qtbot, window):
    """Evaluate, Compare and Search get the Result box's height (their tables and plots need it at 1366×768);
    the Analysis step shows the Result box again. Clicks the tabs as a user does."""
    window.resize(*LAPTOP)
    window.show()
    qtbot.waitExposed(window)
    tab_bar = window.steps.tabBar()
    result = window.result_box.parentWidget()
    assert result.isVisible()
    analysis_height = window.steps.height()
    for page in (window.evaluate, window.compare, window.search):
        qtbot.mouseClick(tab_bar, Qt.MouseButton.LeftButton, pos=tab_bar.tabRect(window.steps.indexOf(page)).center())
        qtbot.waitUntil(lambda: not result.isVisible())
        qtbot.waitUntil(lambda: window.steps.height() > analysis_height + 60)
    rows = list(window.compare.rows.values())[:3]  # Compare's method choices: three rows whole, not scrolled
    for row in rows:
        area = row.values.parentWidget().parentWidget()  # the methods' own scroll area
        assert row.values.mapTo(area, row.values.rect().bottomLeft()).y() <= area.height(), row.values
    viewport = window.search.parentWidget()  # the step's scroll area: the trials table and Run in view, unscrolled
    for widget in (window.search.table, window.search.run.start_button):
        assert widget.mapTo(viewport, widget.rect().bottomLeft()).y() <= viewport.height(), widget
    qtbot.mouseClick(tab_bar, Qt.MouseButton.LeftButton, pos=tab_bar.tabRect(0).center())
    qtbot.waitUntil(result.isVisible)


def test_every_analysis_chart_fits_a_laptop_without_scrolling(qtbot, window, demo_models):
    """The charts' pages fill the step and no more than their minimum beyond it (a wrapping note once grew the heat map's page to twice the
    step's height, the map's lower rows and its legend out of view); Which method? is text and may scroll."""
    base, agents = demo_models
    window.resize(*LAPTOP)
    window.show()
    load_sources(qtbot, window, base, agents)
    analyse(qtbot, window)
    viewport = window.analysis.parentWidget()
    tabs = window.analysis.tabs
    for i in range(tabs.count()):
        tabs.setCurrentIndex(i)
        qtbot.wait(100)  # the step's scroll area sizes the page on a later turn of the event loop
        if tabs.currentWidget() is not window.analysis.which_method:
            needed = max(viewport.height(), window.analysis.minimumSizeHint().height())
            qtbot.waitUntil(lambda: window.analysis.height() <= needed, timeout=2000)  # noqa: B023
