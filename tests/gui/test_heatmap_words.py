"""Help ▸ Reading the charts says what the heat map's colours are (issue 47): its words come from the colour
map the heat map draws with (the chart registry's), and they name that map's colours truly."""

from __future__ import annotations

from PySide6.QtGui import QColor

from .conftest import analyse, load_sources

# a colour's name in words -> what its hue (degrees) and lightness (0..1) must be
WORDS = {
    "dark purple": lambda h, light: 260 <= h <= 320 and light < 0.35,
    "purple": lambda h, light: 260 <= h <= 320,
    "teal": lambda h, light: 160 <= h <= 200,
    "yellow": lambda h, light: 45 <= h <= 70 and light > 0.5,
    "green": lambda h, light: 80 <= h <= 159,
}


def _named(colour: QColor) -> list[str]:
    return [w for w, fits in WORDS.items() if fits(colour.hslHue(), colour.lightnessF())]


def test_help_names_the_heat_maps_colours(qtbot, window, demo_models):
    from ram_desktop.gui.analysis.panel import reading_the_charts

    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    analyse(qtbot, window)
    window.analysis.tabs.setCurrentWidget(window.analysis.heatmap)
    qtbot.waitUntil(lambda: window.analysis.heatmap.plot is not None, timeout=5000)
    cmap = window.analysis.heatmap.cmap  # what the heat map draws with
    low, high = cmap.map(0.0, mode="qcolor"), cmap.map(1.0, mode="qcolor")
    text = reading_the_charts()
    section = text[text.index("Layers × modules") :].split("<h3>")[0]
    assert "darker cell" not in section or low.lightnessF() > high.lightnessF(), section
    assert any(w in section for w in _named(low)), (low.name(), section)
    assert any(w in section for w in _named(high)), (high.name(), section)


def test_the_registrys_words_are_its_colour_maps_colours():
    from ram_desktop.gui.analysis.charts import HEAT_SCALE
    from ram_desktop.gui.analysis.panel import CHARTS, reading_the_charts

    heatmap = next(c for c in CHARTS if c.name == "heatmap")
    assert heatmap.scale is HEAT_SCALE
    cmap = HEAT_SCALE.colormap()
    for value, word in HEAT_SCALE.stops:
        colour = cmap.map(value, mode="qcolor")
        assert word in _named(colour), (value, word, colour.name())
        assert f"{word} at {value:g}" in reading_the_charts()
