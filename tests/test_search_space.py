"""What ``search`` varies (the paper's ranges first, then the declared ones) and the statistics it reports,
against values written out by hand."""

from __future__ import annotations

import math

import pytest

from ram_desktop.core import METHODS, SEARCH_METHODS
from ram_desktop.evaluate.search import paper_interval, search_space
from ram_desktop.evaluate.stats import clearly_better, mean_interval, paired_difference


@pytest.mark.parametrize(
    ("text", "span"),
    [
        ("0.1-0.9 in steps of 0.1 (Table 11)", (0.1, 0.9)),
        ("0.1, 0.3, 0.5, 0.7, 0.9, 1.0 (Table 11)", (0.1, 1.0)),
        ("0.1; ablation 0.0-0.2 (Table 2)", (0.0, 0.2)),
        ("256-2048", (256.0, 2048.0)),
        ("2.0 (paper setting)", None),
        (None, None),
    ],
)
def test_paper_interval_reads_the_span_a_range_text_gives(text, span):
    assert paper_interval(text) == span


def test_the_default_methods_search_the_papers_ranges():
    spaces = {m: {d.param: d for d in search_space(m)} for m in SEARCH_METHODS}
    assert set(spaces["ram"]) == set(spaces["average"]) == set()
    assert (spaces["ram-plus"]["r"].low, spaces["ram-plus"]["r"].high, spaces["ram-plus"]["r"].source) == (
        0.0,
        0.2,
        "paper",
    )
    alpha = spaces["ram-plus"]["alpha"]  # no paper range (one setting): its declared range
    assert (alpha.low, alpha.high, alpha.source) == (0.0, 1000.0, "declared")
    assert (spaces["task-arithmetic"]["scale"].low, spaces["task-arithmetic"]["scale"].high) == (0.1, 1.0)
    assert (spaces["ties"]["density"].low, spaces["ties"]["density"].high) == (0.1, 0.3)
    assert spaces["ties"]["ties_scope"].choices == ("tensor", "model")
    for dare in ("dare-ta", "dare-ties"):
        assert (spaces[dare]["drop"].low, spaces[dare]["drop"].high) == (0.1, 0.9)
        assert (spaces[dare]["scale"].low, spaces[dare]["scale"].high) == (0.1, 1.0)  # Table 11's λ range
        assert "seed" not in spaces[dare]
    for method in SEARCH_METHODS:  # every default lies in its searched range (the first trials)
        resolved = METHODS[method].resolve({})
        for d in spaces[method].values():
            value = resolved[d.param]
            assert value in d.choices if d.kind == "choice" else d.low <= value <= d.high, (method, d)


def test_wide_positive_ranges_are_searched_on_a_log_scale():
    lr = {d.param: d for d in search_space("wudi")}["lr"]
    assert lr.log and (lr.low, lr.high) == (1e-12, 1.0)


def test_mean_interval_and_paired_difference_as_written_out():
    low, high = mean_interval([1.0, 0.0, 1.0, 1.0])  # mean 0.75, sd 0.5, se 0.25; clipped to the values' range
    assert math.isclose(low, 0.75 - 1.96 * 0.25) and high == min(0.75 + 1.96 * 0.25, 1.0) == 1.0
    mean, se = paired_difference([1, 1, 0, 1], [0, 1, 0, 0])  # d = 1, 0, 0, 1: mean 0.5, sd √(1/3)
    assert math.isclose(mean, 0.5) and math.isclose(se, math.sqrt(1 / 3) / 2)
    assert not clearly_better([1, 1, 0, 1], [0, 1, 0, 0])  # 0.5 − 1.96 · 0.289 < 0
    a, b = [1.0] * 10, [0.0] * 8 + [1.0, 1.0]  # d: eight 1s, two 0s: mean 0.8, se 0.1333
    assert clearly_better(a, b) and not clearly_better(b, a)
