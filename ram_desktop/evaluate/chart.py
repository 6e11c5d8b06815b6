"""The scores chart, described once (no Qt): grouped bars (one group per suite, one bar per model) with
95 % error bars, a value label on every bar, each suite's floor as a dashed line, and one colour per
model. ``compare.png`` (matplotlib, ``draw_png``) and the window's Evaluate and Compare charts
(pyqtgraph) both draw a ``ScoreChart``, so bars, error bars, labels and colours are defined here only.

Colours: the base grey; the agents the palette's first colours, in order (as in Analysis); every other
model the next palette colour after the agents'. ``PALETTE`` is Okabe & Ito's colours that read on white
(their orange, sky blue and yellow are too light for text), then Paul Tol's dark "muted" colours, black
and brown: twelve colours, pairwise far apart in CIELAB and each at least 3:1 against white
(tests/gui/test_charts_fit.py checks both); past twelve, further hues that keep clear of them.
"""

from __future__ import annotations

import colorsys
import itertools
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .results import EvalResult

log = logging.getLogger("ram_desktop")

PALETTE = [
    "#0072b2",
    "#d55e00",
    "#009e73",
    "#cc79a7",
    "#332288",
    "#999933",
    "#882255",
    "#000000",
    "#117733",
    "#aa4499",
    "#8c564b",
    "#cc6677",
]
BASE_COLOR = "#9e9e9e"  # the base model: grey, in no other role
FOREGROUND = "#333333"
FLOOR_COLOR = "#b00020"
GROUP_WIDTH = 0.8  # of the 1.0 between two suites' centres
Y_LABEL = "mean reward"
KEY = "error bars: 95 % intervals · dashed: floor (best constant answer)"


def palette_color(index: int) -> str:
    """The ``index``-th colour of the palette; past its end, further hues that keep clear of it."""
    if index < len(PALETTE):
        return PALETTE[index]
    r, g, b = colorsys.hsv_to_rgb(((index - len(PALETTE)) * 0.618034 + 0.05) % 1.0, 0.85, 0.55)
    return "#{:02x}{:02x}{:02x}".format(*(round(255 * c) for c in (r, g, b)))


def model_colors(kinds: Sequence[str], agent_slots: Sequence[int] | None = None) -> list[str]:
    """One colour per model of these kinds (base, agent, merged, variant, other): no two share one.
    ``agent_slots``: the palette slot of each agent model in order (the window keys colours by agent, so an
    agent keeps its colour through remove and reorder); default: the agents take slots 0, 1, 2 …; every
    other model takes the next slot no agent uses."""
    n_agents = kinds.count("agent")
    slots = list(agent_slots) if agent_slots is not None else list(range(n_agents))
    assert len(slots) == n_agents, (slots, kinds)
    free = (i for i in itertools.count() if i not in set(slots))
    colors, agent = [], 0
    for kind in kinds:
        if kind == "base":
            colors.append(BASE_COLOR)
        elif kind == "agent":
            colors.append(palette_color(slots[agent]))
            agent += 1
        else:
            colors.append(palette_color(next(free)))
    return colors


@dataclass(frozen=True)
class Series:
    """One model's bars: its score on every suite, the interval around it (None: unknown) and the label
    written above each bar."""

    name: str
    color: str
    values: tuple[float, ...]
    lows: tuple[float | None, ...]
    highs: tuple[float | None, ...]
    labels: tuple[str, ...]


@dataclass(frozen=True)
class ScoreChart:
    """What a scores chart shows; ``x(m, s)`` is the centre of model m's bar in suite s's group."""

    title: str  # the first line; the second is ``KEY``
    suites: tuple[str, ...]
    series: tuple[Series, ...]
    floors: tuple[float | None, ...]  # per suite: the best constant answer's score
    y_top: float
    y_label: str = Y_LABEL

    @property
    def bar_width(self) -> float:
        return GROUP_WIDTH / max(len(self.series), 1)

    def x(self, m: int, s: int) -> float:
        return s + (m - (len(self.series) - 1) / 2) * self.bar_width

    def label_y(self, m: int, s: int) -> float:
        """Where model m's label on suite s sits: just above its bar or its error bar, whichever is higher."""
        series = self.series[m]
        high = series.highs[s]
        return max(series.values[s], high if high is not None else series.values[s]) + 0.01 * self.y_top


def score_chart(
    result: EvalResult,
    kinds: Sequence[str] | None = None,
    title: str = "Scores per suite",
    agent_slots: Sequence[int] | None = None,
) -> ScoreChart:
    """The chart of ``result``; ``kinds`` (one per model: base, agent, merged, variant, other) pick the
    colours (default: every model "other"), ``agent_slots`` the agents' (``model_colors``)."""
    kinds = list(kinds) if kinds is not None else ["other"] * len(result.models)
    colors = model_colors(kinds, agent_slots)
    series = []
    for m, (model, row) in enumerate(zip(result.models, result.scores)):
        intervals = [result.interval(m, s) for s in range(len(result.suites))]
        series.append(
            Series(
                model.name,
                colors[m],
                tuple(0.0 if math.isnan(v) else v for v in row),  # NaN: its scorer failed; no bar
                tuple(i[0] if i else None for i in intervals),
                tuple(i[1] if i else None for i in intervals),
                tuple(
                    "failed" if math.isnan(v) else f"{v:.2f}" + ("≈" if result.at_floor(m, s) else "")
                    for s, v in enumerate(row)
                ),
            )
        )
    floors = tuple(s.floor.score if s.floor is not None else None for s in result.suites)
    tops = [v for row in result.scores for v in row if not math.isnan(v)]
    tops += [h for s in series for h in s.highs if h is not None]
    top = max([1.0, *tops])
    return ScoreChart(title, tuple(s.name for s in result.suites), tuple(series), floors, top * 1.12)


def kinds_of(result: EvalResult, kinds: Mapping[str, str]) -> list[str]:
    """The kind of each model of ``result`` from a source -> kind map (unknown sources: "other")."""
    return [kinds.get(m.source, "other") for m in result.models]


def draw_png(chart: ScoreChart, path: Path) -> bool:
    """Draw ``chart`` as a PNG with matplotlib's headless backend; False (and a log line) when matplotlib
    is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed: %s not drawn (pip install 'ram-desktop[eval]')", Path(path).name)
        return False
    n_models, n_suites = len(chart.series), len(chart.suites)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 + n_suites * (0.6 + 0.42 * n_models)), 4.4), dpi=120)
    width = chart.bar_width
    vertical = n_models > 4  # many narrow bars: labels upright
    for m, series in enumerate(chart.series):
        xs = [chart.x(m, s) for s in range(n_suites)]
        lower = [v - lo if lo is not None else 0.0 for v, lo in zip(series.values, series.lows)]
        upper = [hi - v if hi is not None else 0.0 for v, hi in zip(series.values, series.highs)]
        ax.bar(xs, series.values, width * 0.92, color=series.color, label=series.name, edgecolor=series.color)
        ax.errorbar(xs, series.values, yerr=[lower, upper], fmt="none", ecolor=FOREGROUND, elinewidth=0.8, capsize=2)
        for s, x in enumerate(xs):
            ax.text(
                x,
                chart.label_y(m, s),
                series.labels[s],
                ha="center",
                va="bottom",
                fontsize=6.5,
                rotation=90 if vertical else 0,
                color=FOREGROUND,
            )
    for s, floor in enumerate(chart.floors):
        if floor is not None:
            half = GROUP_WIDTH / 2 + 0.04
            ax.hlines(floor, s - half, s + half, colors=FLOOR_COLOR, linestyles="dashed", linewidth=1.0)
    ax.set_xticks(range(n_suites), list(chart.suites))
    ax.set_ylabel(chart.y_label)
    ax.set_ylim(0, chart.y_top)
    ax.set_xlim(-0.55, n_suites - 0.45)
    ax.set_title(f"{chart.title}\n{KEY}" if chart.series else chart.title, fontsize=10)
    ax.legend(fontsize=8, ncol=1, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True
