"""Evaluate and Compare in the window, driven through real widgets: scores equal a greedy generation
written out in the test, cancel stops within one batch and writes nothing, a compare of two variants
is one compare() call, the best merged score is marked, the table and chart export."""

from __future__ import annotations

import csv
import json
import shutil
import threading
import time
from pathlib import Path

import pytest
from PySide6.QtCore import Qt, QTimer

pytest.importorskip("transformers")

from ram_desktop.evaluate import EvalResult, ModelRef, SuiteSummary  # noqa: E402
from ram_desktop.gui import main_window  # noqa: E402
from ram_desktop.gui.analysis import charts  # noqa: E402
from ram_desktop.gui.evaluate import compare_panel  # noqa: E402
from ram_desktop.gui.evaluate import panel as evaluate_panel

from ..test_compare import _tiny_agents  # noqa: E402
from ..test_evaluate_runner import reference  # noqa: E402
from .conftest import load_sources, merge  # noqa: E402

PROMPTS = ["What is 2 + 3?", "Say hello to the world", "Remember the number 42", "def add(a, b):",
           "tool call: search(query='weather')", "Question: how many legs does a cat have?"]
MAX_NEW = 5


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, list[Path], Path]:
    """A tiny transformers base, two agents, and a suite whose answers are pieces of the base's and the
    agents' greedy completions (so the models score differently, none at 0 or 1 by accident)."""
    root = tmp_path_factory.mktemp("tiny")
    base, agents = _tiny_agents(root / "models")
    models = [base, *agents]
    rows = []
    for i, prompt in enumerate(PROMPTS):
        completion, _ = reference(models[i % 3], prompt, MAX_NEW, qwen2_pipeline=True)
        rows.append({"prompt": prompt, "answer": completion[:3].strip() or "zzz"})
    suite = root / "toy"
    suite.mkdir()
    (suite / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (suite / "suite.yaml").write_text(f"name: toy\nscorer: contains\nmax_new_tokens: {MAX_NEW}\nchat_template: false\n")
    return base, agents, suite


def expected_score(folder: Path, suite: Path) -> float:
    """The mean 'contains' reward of a greedy completion written out per example (test_evaluate_runner)."""
    rows = [json.loads(line) for line in (suite / "data.jsonl").read_text().splitlines()]
    hits = [r["answer"] in reference(folder, r["prompt"], MAX_NEW, qwen2_pipeline=True)[0] for r in rows]
    return sum(hits) / len(hits)


def add_suite_by_dialog(qtbot, window, monkeypatch, path: Path) -> None:
    monkeypatch.setattr(evaluate_panel.QFileDialog, "getExistingDirectory", lambda *a, **k: str(path))
    with qtbot.waitSignal(window.evaluate.suites_loaded, timeout=10000):
        qtbot.mouseClick(window.evaluate.add_folder_button, Qt.LeftButton)


def table_values(panel) -> dict[str, list[str]]:
    t = panel.table
    return {t.item(r, 0).text(): [t.item(r, c).text() for c in range(1, t.columnCount())]
            for r in range(t.rowCount())}


def bold_cells(panel) -> set[tuple[str, int]]:
    t = panel.table
    return {(t.item(r, 0).text(), c) for r in range(t.rowCount()) for c in range(1, t.columnCount())
            if t.item(r, c).font().bold()}


def fake_merged(folder: Path, source: Path) -> Path:
    """A copy of a model with a merge report: a RAM Desktop output folder as far as Evaluate is concerned."""
    shutil.copytree(source, folder)
    (folder / "merge-report.json").write_text("{}\n")
    (folder / "README.md").write_text("# Merged\n\n## Agents\n\ntwo\n")
    return folder


def test_evaluate_after_a_merge_scores_like_plain_greedy_and_fills_the_card(qtbot, window, tiny, tmp_path,
                                                                            monkeypatch):
    base, agents, suite = tiny
    load_sources(qtbot, window, base, agents)
    window.method.set_method("task-arithmetic", {"scale": 1.0})
    window.method.set_out_dtype("float32")
    window.method.out_dir.setText(str(tmp_path / "merged"))
    merge(qtbot, window)
    panel = window.evaluate
    assert window.steps.currentWidget() is window.analysis
    qtbot.mouseClick(window.evaluate_result_button, Qt.LeftButton)
    assert window.steps.currentWidget() is panel
    add_suite_by_dialog(qtbot, window, monkeypatch, suite)
    assert panel.suite_table.item(0, 0).text() == "toy" and panel.suite_table.item(0, 1).text() == "6"
    assert panel.suite_table.cellWidget(0, 2).currentText() == "contains"
    assert [(m.name, m.kind) for m in panel.checked_models()] == [
        ("base", "base"), ("left", "agent"), ("right", "agent"), ("merged", "merged")]
    panel.batch_size.setValue(4)

    beats: list[float] = []
    timer = QTimer()
    timer.setInterval(5)
    timer.timeout.connect(lambda: beats.append(time.perf_counter()))
    timer.start()
    with qtbot.waitSignal(panel.evaluation_finished, timeout=120000) as done:
        qtbot.mouseClick(panel.run.start_button, Qt.LeftButton)
    timer.stop()
    assert done.args == ["done"], window.message.text.text()
    worst = max(b - a for a, b in zip(beats, beats[1:]))
    print(f"heartbeat during the evaluation: {len(beats)} beats, longest stall {1000 * worst:.1f} ms")
    assert worst <= 0.1

    expected = {name: expected_score(folder, suite) for name, folder in
                [("base", base), ("left", agents[0]), ("right", agents[1]), ("merged", tmp_path / "merged")]}
    assert len(set(expected.values())) > 1  # the suite tells the models apart
    assert table_values(panel) == {name: [f"{v:.3f}", f"{v:.3f}"] for name, v in expected.items()}
    assert bold_cells(panel) == {("merged", 1), ("merged", 2)}  # the only merged model is the best merged
    assert "Done" in panel.run.bar.format() or panel.run.bar.value() == 1000

    data = json.loads((tmp_path / "merged" / "eval.json").read_text())
    assert data["format"] == "ram-eval/1"
    assert [m["name"] for m in data["models"]] == ["base", "left", "right", "merged"]
    assert data["scores"] == [[expected[n]] for n in ["base", "left", "right", "merged"]]
    card = (tmp_path / "merged" / "README.md").read_text()
    assert card.count("## Evaluation") == 1
    assert f"| **merged** | **{expected['merged']:.3f}** | **{expected['merged']:.3f}** |" in card
    assert f"| base | {expected['base']:.3f} | {expected['base']:.3f} |" in card
    assert "## Agents" in card  # the merge's own card stays


def test_cancel_stops_within_one_batch_and_writes_nothing(qtbot, window, tiny, tmp_path, monkeypatch):
    import transformers

    base, _, suite = tiny
    merged = fake_merged(tmp_path / "m", base)
    card_before = (merged / "README.md").read_text()
    panel = window.evaluate
    add_suite_by_dialog(qtbot, window, monkeypatch, suite)
    monkeypatch.setattr(evaluate_panel.QFileDialog, "getExistingDirectory", lambda *a, **k: str(merged))
    qtbot.mouseClick(panel.add_model_button, Qt.LeftButton)
    assert [(m.name, m.kind) for m in panel.checked_models()] == [("m", "merged")]
    panel.batch_size.setValue(2)
    calls, release = [], threading.Event()
    original = transformers.GenerationMixin.generate

    def generate(self, *args, **kwargs):
        calls.append(kwargs["input_ids"].shape[0])
        release.wait(20)  # the batch is under way when the user clicks Cancel
        return original(self, *args, **kwargs)

    monkeypatch.setattr(transformers.GenerationMixin, "generate", generate)
    qtbot.mouseClick(panel.run.start_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: bool(calls), timeout=30000)
    assert panel.run.cancel_button.isEnabled() and not panel.run.start_button.isEnabled()
    assert not window.merge_button.isEnabled()  # one job at a time
    with qtbot.waitSignal(panel.evaluation_finished, timeout=30000) as done:
        qtbot.mouseClick(panel.run.cancel_button, Qt.LeftButton)
        release.set()
    assert done.args == ["cancelled"]
    assert calls == [2]  # 6 examples in batches of 2: the running batch finished, no other started
    assert not (merged / "eval.json").exists()
    assert (merged / "README.md").read_text() == card_before
    assert panel.result is None and panel.table.rowCount() == 0
    assert "cancelled" in window.message.text.text().lower()
    assert panel.run.start_button.isEnabled()


def test_compare_two_variants_is_one_compare_and_shows_them_side_by_side(qtbot, window, tiny, tmp_path, monkeypatch):
    base, agents, suite = tiny
    load_sources(qtbot, window, base, agents)
    window.method.set_out_dtype("float32")
    add_suite_by_dialog(qtbot, window, monkeypatch, suite)
    calls = []
    original = compare_panel.compare

    def counted(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(compare_panel, "compare", counted)
    panel = window.compare
    window.steps.setCurrentWidget(panel)
    panel.tick("ram-plus", "0, 0.2", "r")
    panel.folder.setText(str(tmp_path / "cmp"))
    assert "toy" in panel.summary.text()
    window.evaluate.run.end("Scored 3 models on 1 suite in 2 s", True)  # a previous evaluation's status
    with qtbot.waitSignal(panel.compare_finished, timeout=120000) as done:
        qtbot.mouseClick(panel.run.start_button, Qt.LeftButton)
        row = panel.rows["ram-plus"]  # running: the sweep cannot change under it
        assert not row.values.isEnabled() and not row.param.isEnabled()
    assert done.args == ["done"], window.message.text.text()
    assert len(calls) == 1
    assert row.values.isEnabled() and "Scored 3 models" not in window.evaluate.run.label.text()
    assert "Compare scored 5 models" in window.evaluate.run.label.text()
    assert window.steps.currentWidget() is window.evaluate
    names = ["ram-plus_r=0", "ram-plus_r=0.2"]
    data = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert [v["name"] for v in data["variants"]] == names
    assert [v["params"]["r"] for v in data["variants"]] == [0.0, 0.2]
    expected = {"base": expected_score(base, suite), "left": expected_score(agents[0], suite),
                "right": expected_score(agents[1], suite)}
    expected.update({n: expected_score(tmp_path / "cmp" / n, suite) for n in names})
    assert table_values(window.evaluate) == {n: [f"{v:.3f}", f"{v:.3f}"] for n, v in expected.items()}
    best = max(names, key=lambda n: (expected[n], -names.index(n)))
    assert bold_cells(window.evaluate) == {(best, 1), (best, 2)}
    for n in names:
        assert json.loads((tmp_path / "cmp" / n / "eval.json").read_text())["format"] == "ram-eval/1"
        assert "## Evaluation" in (tmp_path / "cmp" / n / "README.md").read_text()
    variants = [(m.name, m.kind) for m in window.evaluate.checked_models() if m.kind == "variant"]
    assert variants == [(n, "variant") for n in names]


def test_bad_compare_values_are_refused_before_anything_runs(qtbot, window, tiny, tmp_path):
    base, agents, _ = tiny
    load_sources(qtbot, window, base, agents)
    window.compare.tick("ram-plus", "0.1, lots", "r")
    window.compare.folder.setText(str(tmp_path / "cmp"))
    qtbot.mouseClick(window.compare.run.start_button, Qt.LeftButton)
    assert not window.jobs.busy()
    assert "lots" in window.message.text.text() and "--r" in window.message.text.text()
    assert not (tmp_path / "cmp").exists()


def synthetic_result() -> tuple[EvalResult, dict[str, str]]:
    models = [ModelRef("base", "/m/base"), ModelRef("coder", "/m/coder"), ModelRef("tool", "/m/tool"),
              ModelRef("ram", "/c/ram"), ModelRef("ta", "/c/ta")]
    suites = [SuiteSummary("code", "/s/code", 10, "exact"), SuiteSummary("tool", "/s/tool", 20, "contains")]
    scores = [[0.2, 0.1], [0.9, 0.15], [0.1, 0.8], [0.6, 0.55], [0.7, 0.3]]
    kinds = {"/m/base": "base", "/m/coder": "agent", "/m/tool": "agent", "/c/ram": "variant", "/c/ta": "variant"}
    return EvalResult(models, suites, scores, 1.0, "cpu", {}), kinds


def test_best_merged_score_marked_and_table_exported(qtbot, window, tmp_path, monkeypatch):
    result, kinds = synthetic_result()
    panel = window.evaluate
    assert not panel.export_csv_button.isEnabled()
    panel.show_result(result, kinds)
    # the agents' 0.9 and 0.8 are higher, but only merged models compete for the mark
    assert bold_cells(panel) == {("ta", 1), ("ram", 2), ("ram", 3)}  # code, tool, mean (0.575 vs 0.5)
    assert table_values(panel)["ram"] == ["0.600", "0.550", "0.575"]
    assert panel.table.horizontalHeaderItem(1).text() == "code\n(10)"
    assert "best merged" in panel.note.text()

    monkeypatch.setattr(evaluate_panel.QFileDialog, "getSaveFileName", lambda *a, **k: (str(tmp_path / "s.csv"), ""))
    qtbot.mouseClick(panel.export_csv_button, Qt.LeftButton)
    rows = list(csv.reader(open(tmp_path / "s.csv", newline="")))
    assert rows[0] == ["model", "kind", "source", "code", "tool", "mean"]
    assert rows[4] == ["ram", "variant", "/c/ram", "0.6", "0.55", "0.575"]
    assert rows[-1] == ["best merged", "", "", "ta", "ram", "ram"]
    assert len(rows) == 7

    monkeypatch.setattr(evaluate_panel.QFileDialog, "getSaveFileName", lambda *a, **k: (str(tmp_path / "s.png"), ""))
    qtbot.mouseClick(panel.export_png_button, Qt.LeftButton)
    from PySide6.QtGui import QImage

    image = QImage(str(tmp_path / "s.png"))
    assert not image.isNull() and image.width() > 200
    colors = {image.pixelColor(x, y).name() for x in range(0, image.width(), 3) for y in range(0, image.height(), 3)}
    assert {"#9e9e9e", charts.PALETTE[0], charts.PALETTE[2]} <= colors  # bars were drawn


def test_rows_merge_on_the_same_suites_and_reset_on_others(qtbot, window):
    result, kinds = synthetic_result()
    panel = window.evaluate
    panel.show_result(result, kinds)
    again = EvalResult([ModelRef("ta", "/c/ta"), ModelRef("new", "/c/new")], result.suites, [[0.0, 0.0], [1.0, 1.0]],
                       1.0, "cpu", {})
    panel.show_result(again, {"/c/new": "variant"})
    values = table_values(panel)
    assert list(values) == ["base", "coder", "tool", "ram", "ta", "new"]
    assert values["ta"] == ["0.000", "0.000", "0.000"]
    other = EvalResult([ModelRef("x", "/x")], [SuiteSummary("other", "/s/o", 3, "exact")], [[0.5]], 1.0, "cpu", {})
    panel.show_result(other)
    assert list(table_values(panel)) == ["x"]


def test_python_scorer_shows_its_file_and_runs_only_in_the_evaluation(qtbot, window, tiny, tmp_path, monkeypatch):
    base, _, _ = tiny
    folder = tmp_path / "py"
    folder.mkdir()
    marker = tmp_path / "ran"
    (folder / "reward.py").write_text(f"open({str(marker)!r}, 'a').write('x')\n"
                                      "def reward(prompts, completions, **columns):\n"
                                      "    return [float(len(c) > 0) for c in completions]\n")
    (folder / "data.jsonl").write_text(json.dumps({"prompt": "Say hello"}) + "\n")
    (folder / "suite.yaml").write_text("name: py\nscorer: python:reward.py:reward\nmax_new_tokens: 3\n")
    panel = window.evaluate
    add_suite_by_dialog(qtbot, window, monkeypatch, folder)
    shown = panel.suite_table.item(0, 3)
    assert str(folder / "reward.py") in shown.text() and "runs when the evaluation starts" in shown.text()
    assert not marker.exists()
    panel.add_model_folder(Path(base))
    with qtbot.waitSignal(panel.evaluation_finished, timeout=60000) as done:
        qtbot.mouseClick(panel.run.start_button, Qt.LeftButton)
    assert done.args == ["done"], window.message.text.text()
    assert marker.exists()
    assert table_values(panel)["base"][0] in ("0.000", "1.000")


def test_scorer_picker_accepts_a_builtin_and_refuses_a_bad_spec(qtbot, window, tiny, monkeypatch):
    _, _, suite = tiny
    panel = window.evaluate
    add_suite_by_dialog(qtbot, window, monkeypatch, suite)
    combo = panel.suite_table.cellWidget(0, 2)
    combo.setCurrentText("exact")
    combo.lineEdit().editingFinished.emit()
    assert panel.suites[0].scorer == "exact" and panel.suite_table.item(0, 3).text() == "exact"
    combo.setCurrentText("python:missing.py:f")
    combo.lineEdit().editingFinished.emit()
    assert panel.suites[0].scorer == "exact" and combo.currentText() == "exact"
    assert "missing.py" in window.message.text.text()


def test_demo_preloads_the_suites_its_manifest_names(qtbot, window, demo_models, tmp_path, monkeypatch, tiny):
    base, agents = demo_models
    _, _, suite = tiny
    demo = tmp_path / "demo"
    shutil.copytree(base, demo / "base")
    for a in agents:
        shutil.copytree(a, demo / a.name)
    shutil.copytree(suite, demo / "suites" / "toy")
    (demo / "suites" / "more.jsonl").write_text(json.dumps({"prompt": "p", "answer": "a"}) + "\n")
    (demo / "demo.json").write_text(json.dumps({"base": "base", "agents": [
        {"name": agents[0].name, "path": agents[0].name, "suite": "suites/toy"},
        {"name": agents[1].name, "path": agents[1].name, "suite": "suites/more.jsonl"},
        {"name": agents[2].name, "path": agents[2].name, "suite": "suites/toy"}]}))
    monkeypatch.setattr(main_window, "ensure_demo", lambda: (demo / "base", [demo / a.name for a in agents]))
    with qtbot.waitSignal(window.analysis_finished, timeout=60000):
        window.load_demo()
    qtbot.waitUntil(lambda: len(window.evaluate.suites) == 2, timeout=10000)
    assert [s.name for s in window.evaluate.suites] == ["toy", "more"]
    assert [m.kind for m in window.evaluate.checked_models()] == ["base", "agent", "agent", "agent"]
    from ram_desktop.paths import outputs_dir

    assert window.compare.folder.text() == str(outputs_dir() / "demo" / "compare")  # visible, not beside the demo


def test_a_broken_demo_manifest_is_reported(qtbot, window, tmp_path):
    (tmp_path / "demo.json").write_text("[1, 2]")
    assert window.evaluate.preload_demo(tmp_path) == []
    assert "demo.json" in window.message.text.text()


def _drawn_labels(axis) -> list[str]:
    from PySide6.QtGui import QImage, QPainter

    image = QImage(10, 10, QImage.Format.Format_ARGB32)
    painter = QPainter(image)
    try:
        _, _, texts = axis.generateDrawSpecs(painter)
    finally:
        painter.end()
    return [text for _, _, text in texts]


def test_every_suite_keeps_its_label_on_a_narrow_chart(qtbot, window):
    """pyqtgraph hides a tick label that reaches past the axis: on a narrow window the first and last
    suites' names used to vanish. Each is now cut to its group's width, with … at the end."""
    suites = [SuiteSummary(name, f"/s/{name}", 10, "exact") for name in ("code-validation", "tool-validation",
                                                                           "memory-validation")]
    long_name = "task-arithmetic_scale=0.3_density=0.2_drop=0.5"
    result = EvalResult([ModelRef("base", "/m/base"), ModelRef("ram", "/c/ram"), ModelRef(long_name, "/c/ta")], suites,
                        [[0.1, 0.2, 0.3], [0.3, 0.2, 0.1], [0.2, 0.2, 0.2]], 1.0, "cpu", {})
    panel = window.evaluate
    window.steps.setCurrentWidget(panel)
    panel.show_result(result, {"/m/base": "base", "/c/ram": "variant", "/c/ta": "variant"})
    panel.scores.views.setCurrentWidget(panel.chart)  # the chart's tab beside the table's
    legend = [label.text for _, label in panel.chart.legend.items]
    assert legend == ["base", "ram", long_name]  # every name whole: the legend sizes to its text
    axis = panel.chart.plot.getAxis("bottom")
    names = [s.name for s in suites]
    seen = {}
    for width in (2400, 700, 480):
        panel.chart.setFixedWidth(width)
        qtbot.wait(50)
        labels = [label.replace("\n", "") for label in _drawn_labels(axis)]  # a long name may take two lines
        assert len(labels) == 3, (width, labels)
        for label, name in zip(labels, names):
            assert label == name or (label.endswith("…") and name.startswith(label[:-1])), (width, label)
        seen[width] = labels
    assert seen[2400] == names  # room for the whole names
    assert any("…" in label for label in seen[480])
