"""Messages that know the method (issue 47): the one-agent warning, the ρ–λ table and the "base itself" warning
speak of RAM only for the RAM family, and layer stacking prints no task-vector table; each run in a fresh
``ram-merge`` process, warnings shown (no ``-q``)."""

from __future__ import annotations

import json

import pytest

from ram_desktop.core import MergeSpec
from tests.conftest import SMALL_CONFIG, make_models
from tests.subproc import cli


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("WARNING:")]


def _table_head(stdout: str) -> str:
    return next(line for line in stdout.splitlines() if line.startswith("agent "))


def test_one_agent_slerp_says_slerp_and_prints_no_rho_or_lambda(tmp_path):
    base, agents = make_models(tmp_path / "in", agents={"coder": 0.5})
    MergeSpec.build(str(base), [str(agents[0])], method="slerp").save(tmp_path / "r.yaml")
    done = cli(tmp_path, "run", "r.yaml", "--out", "out", quiet=False)
    assert done.returncode == 0, done.stderr
    one = [w for w in _warnings(done.stderr) if "only one agent" in w]
    assert one and all("SLERP" in w and "RAM" not in w and "rescal" not in w for w in one), one
    head = _table_head(done.stdout)
    assert "density" in head and "rho" not in head and "lambda" not in head, done.stdout
    report = json.loads((tmp_path / "out" / "merge-report.json").read_text())
    assert any("SLERP" in w for w in report["warnings"]) and not any("RAM" in w for w in report["warnings"])
    card = (tmp_path / "out" / "README.md").read_text()
    assert "merges 1 reinforcement-learning-trained agent into" in card and "ρ" not in card and "λ" not in card


def test_one_agent_ram_plus_says_it_reproduces_the_agent_and_keeps_its_table(tmp_path):
    base, agents = make_models(tmp_path / "in", agents={"coder": 0.5})
    done = cli(tmp_path, "merge", str(base), str(agents[0]), "--out", "out", "--method", "ram-plus", quiet=False)
    assert done.returncode == 0, done.stderr
    one = [w for w in _warnings(done.stderr) if "only one agent" in w]
    assert len(one) == 1 and "RAM+" in one[0] and "reproduces that agent" in one[0], one
    assert "rescales" not in one[0]  # with one agent ρ = 0, so λ = 1: nothing is rescaled
    head = _table_head(done.stdout)
    assert "rho" in head and "lambda" in head, done.stdout
    card = (tmp_path / "out" / "README.md").read_text()
    assert "| ρ | λ |" in card and "Overlap statistics ρ" in card


def test_layer_stacking_lists_no_rho_and_no_base_itself_warning(tmp_path):
    config = dict(SMALL_CONFIG, num_hidden_layers=5, layer_types=["full_attention"] * 5)
    base, agents = make_models(tmp_path / "in", agents={"coder": 0.5}, config=config)
    MergeSpec.build(  # mergekit's way: the base is one of the stacked models
        str(base),
        [str(base), str(agents[0])],
        names=["first", "coder"],
        method="passthrough",
        slices=[{"sources": [{"model": 1, "layer_range": [0, 3]}]}, {"sources": [{"model": 2, "layer_range": [1, 5]}]}],
    ).save(tmp_path / "r.yaml")
    done = cli(tmp_path, "run", "r.yaml", "--out", "out", quiet=False)
    assert done.returncode == 0, done.stderr
    assert not any("base checkpoint itself" in w for w in _warnings(done.stderr)), done.stderr
    assert "rho" not in done.stdout and " inf" not in done.stdout, done.stdout
    assert "merged model written to" in done.stdout
    card = (tmp_path / "out" / "README.md").read_text()  # no task-vector statistics where none were compared
    assert "ρ" not in card and "density" not in card and "## Overlap" not in card and "`" + str(base) in card


def test_the_probe_alone_warns_without_naming_a_method(tmp_path):
    base, agents = make_models(tmp_path / "in", agents={"coder": 0.5})
    done = cli(tmp_path, "probe", str(base), str(agents[0]), quiet=False)
    assert done.returncode == 0, done.stderr
    one = [w for w in _warnings(done.stderr) if "only one agent" in w]
    assert len(one) == 1 and "RAM" not in one[0], one
    assert "rho" in _table_head(done.stdout)  # the probe's own statistics, ρ among them


def test_methods_short_labels_are_names_a_reader_knows():
    """The search tab, charts and tables show ``short_label``: a name, not a code (issue 47: TA-w, Crumbs, Stock)."""
    import re

    from ram_desktop.core import METHODS

    assert METHODS["weighted-task-arithmetic"].short_label == "Weighted TA"
    assert METHODS["breadcrumbs"].short_label == "Breadcrumbs"
    assert METHODS["model-stock"].short_label == "Model Stock"
    for name, m in METHODS.items():
        for word in re.split(r"[\s\-]+", m.short_label):  # an acronym (TA, TIES, RAM+s) or a whole word
            assert word.isupper() or len(word) >= 4 or word == "RAM+s", (name, m.short_label)


def test_the_search_space_and_the_form_name_parameters_in_words():
    """No Python set ``{False, True}``, no raw ``ties_scope`` where the search tab describes what it varies."""
    from ram_desktop.core import METHODS
    from ram_desktop.evaluate.search import search_space

    texts = [d.describe() for m in ("ties", "weighted-ties", "ram-plus") for d in search_space(m)]
    assert "trim scope: tensor or model" in texts and "normalize: false or true" in texts, texts
    assert "r 0 to 0.2 (paper range)" in texts, texts
    assert not [t for t in texts if "{" in t or "True" in t or "ties_scope" in t], texts
    assert next(p for p in METHODS["ties"].params if p.name == "ties_scope").title == "trim scope"


def test_compare_lists_each_variants_parameters_as_written(tmp_path):
    base, agents = make_models(tmp_path / "in")
    done = cli(
        tmp_path, "compare", str(base), *map(str, agents), "--out", "cmp", "--variant", "ram-plus:r=0.2,alpha=1.0"
    )
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("ram-plus"))
    assert "r=0.2, alpha=1.0" in line and "{" not in line, line


def test_evaluation_progress_shows_one_examples_per_second():
    """The window's progress line computes examples/s itself (as the command line's bar does): the runner's
    detail must not add a second, different one."""
    import time

    pytest.importorskip("PySide6")
    from ram_desktop.core import Reporter
    from ram_desktop.evaluate.runner import _Progress
    from ram_desktop.gui.evaluate.run_bar import eta_text

    events = []
    progress = _Progress(Reporter(events.append), 40)
    progress.model_start -= 2.0  # this model started earlier than the stage: the two rates would differ
    progress.batch("merged", "code", 8, 120)
    event = events[-1]
    shown = eta_text("Evaluating", event, (time.monotonic() - 1.0, 0)) + f" · {event.detail}"
    assert shown.count("examples/s") == 1, shown
    assert "merged · code" in shown and "tokens/s" in shown, shown
