"""Faults a new user met in the window (issue 23): what the Merge button may replace, stale panels,
small things. Each test drives real widgets."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

from ..subproc import cli
from .conftest import analyse, load_sources, merge


def _unrelated_folder(parent: Path) -> Path:
    folder = parent / "thesis"
    (folder / "sub").mkdir(parents=True)
    (folder / "thesis.txt").write_text("four years of work")
    (folder / "sub" / "data.csv").write_text("a,b\n1,2\n")
    return folder


def _intact(folder: Path) -> bool:
    return (folder / "thesis.txt").read_text() == "four years of work" and (
        folder / "sub" / "data.csv"
    ).read_text() == "a,b\n1,2\n"


def _record_prompts(monkeypatch) -> list[str]:
    """Every replace prompt the window would show, answered Yes (as a hurried user would)."""
    asked: list[str] = []

    def question(parent, title, text, *args, **kwargs):
        asked.append(text)
        return QMessageBox.Yes

    monkeypatch.setattr(QMessageBox, "question", staticmethod(question))
    return asked


def test_merge_refuses_an_unrelated_folder_without_asking_and_offers_a_new_one(
    qtbot, window, demo_models, tmp_path, monkeypatch
):
    base, agents = demo_models
    asked = _record_prompts(monkeypatch)
    folder = _unrelated_folder(tmp_path)
    load_sources(qtbot, window, base, agents)
    analyse(qtbot, window)
    window.method.out_dir.setText(str(folder))
    qtbot.mouseClick(window.merge_button, Qt.LeftButton)
    qtbot.wait(200)
    assert asked == [] and not window.busy()
    assert _intact(folder)
    assert window.message.kind == "error" and "RAM Desktop did not write" in window.message.text.text()
    assert "Merging" not in window.result_text.text()
    # the bar offers a free sibling folder; taking it merges there, the thesis untouched
    offer = window.message.action_button
    assert offer.isVisible() and "thesis-2" in offer.text()
    qtbot.mouseClick(offer, Qt.LeftButton)
    assert window.method.out_dir.text() == str(tmp_path / "thesis-2")
    merge(qtbot, window)
    assert asked == [] and _intact(folder) and (tmp_path / "thesis-2" / "merge-report.json").is_file()
    # an earlier RAM Desktop output is replaced, after asking once
    with qtbot.waitSignal(window.merge_finished, timeout=60000) as blocker:
        qtbot.mouseClick(window.merge_button, Qt.LeftButton)
    assert blocker.args == ["done"] and len(asked) == 1 and "thesis-2" in asked[0]


def test_output_inside_an_input_is_refused_before_asking(qtbot, window, demo_models, monkeypatch):
    base, agents = demo_models
    asked = _record_prompts(monkeypatch)
    load_sources(qtbot, window, base, agents)
    for out in (agents[0], agents[0] / "inner"):
        window.method.out_dir.setText(str(out))
        qtbot.mouseClick(window.merge_button, Qt.LeftButton)
        qtbot.wait(100)
        assert asked == [] and not window.busy()
        assert window.message.kind == "error" and "input" in window.message.text.text()
    assert (agents[0] / "model.safetensors").is_file() or any(agents[0].glob("*.safetensors"))


def test_cli_overwrite_leaves_an_unrelated_folder_alone(tmp_path, demo_models):
    base, agents = demo_models
    folder = _unrelated_folder(tmp_path)
    done = cli(tmp_path, "merge", str(base), *map(str, agents), "--out", str(folder), "--overwrite")
    assert done.returncode == 2 and "did not write" in done.stderr, done.stderr
    assert _intact(folder) and sorted(p.name for p in folder.iterdir()) == ["sub", "thesis.txt"]


def test_window_title_names_the_app_once(window, demo_models, tmp_path):
    """Qt appends " — <applicationDisplayName>" to a title that does not end with it (formatWindowTitle)."""
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance()
    old = app.applicationDisplayName()
    app.setApplicationDisplayName("RAM Desktop")
    try:
        title = window.windowTitle()
        shown = title if title.endswith("RAM Desktop") else f"{title} — RAM Desktop"
        assert shown.count("RAM Desktop") == 1, shown
    finally:
        app.setApplicationDisplayName(old)


def test_result_line_shows_lambda_only_for_a_rescaling_method(qtbot, window, demo_models, tmp_path):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    analyse(qtbot, window)
    window.method.set_out_dtype("float32")
    window.method.out_dir.setText(str(tmp_path / "ram-plus"))
    merge(qtbot, window)
    assert "λ: coder" in window.result_text.text()
    window.method.method.setCurrentIndex(window.method.method.findData("ties"))
    window.method.out_dir.setText(str(tmp_path / "ties"))
    merge(qtbot, window)
    assert "method ties" in window.result_text.text() and "λ" not in window.result_text.text()


def test_screenshot_needs_no_display(tmp_path):
    """``ram-desktop --demo --screenshot`` with no DISPLAY and no QT_QPA_PLATFORM writes the PNG."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM") and not k.startswith(("RAM_DESKTOP_", "PYTEST"))
    }
    env.update(
        RAM_DESKTOP_CACHE=str(tmp_path / "cache"),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
        HOME=str(tmp_path),
        HF_HUB_OFFLINE="1",
    )
    shot = tmp_path / "shot.png"
    done = subprocess.run(
        [sys.executable, "-c", "from ram_desktop.gui.app import entry; entry()", "--demo", "--screenshot", str(shot)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_failed_merge_leaves_no_merging_result_to_evaluate(qtbot, window, demo_models, tmp_path):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    analyse(qtbot, window)
    window.method.out_dir.setText(str(tmp_path / "merged"))
    merge(qtbot, window)
    assert window.evaluate_result_button.isEnabled()
    (tmp_path / "a-file").write_text("not a folder")
    window.method.out_dir.setText(str(tmp_path / "a-file"))  # the engine refuses it in the worker
    with qtbot.waitSignal(window.merge_finished, timeout=60000) as blocker:
        qtbot.mouseClick(window.merge_button, Qt.LeftButton)
    assert blocker.args == ["failed"]
    assert "Merging" not in window.result_text.text() and "error" in window.result_text.text()
    assert not window.evaluate_result_button.isEnabled() and not window.open_folder_button.isEnabled()


def test_a_source_error_reaches_the_log_and_leaves_the_bar_with_its_row(qtbot, window, demo_models, tmp_path):
    from .conftest import drop_paths

    base, agents = demo_models
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"\xff" * 5)
    drop_paths(window.sources, [base, agents[0], broken])
    qtbot.waitUntil(lambda: not window.sources.busy and len(window.sources.errors()) == 1, timeout=10000)
    assert window.message.isVisible() and "broken.safetensors" in window.message.text.text()
    assert "broken.safetensors" in window.log_view.toPlainText()
    window.sources.table.selectRow(2)
    qtbot.mouseClick(window.sources.remove_button, Qt.LeftButton)
    assert window.sources.errors() == [] and not window.message.isVisible()


def test_the_log_scrolls_to_a_new_error(qtbot, window):
    import logging

    log = logging.getLogger("ram_desktop")
    for i in range(200):
        log.info("line %d", i)
    qtbot.wait(50)
    bar = window.log_view.verticalScrollBar()
    bar.setValue(0)  # the user scrolled back
    log.error("something failed")
    qtbot.wait(50)
    assert bar.value() == bar.maximum() > 0


def test_a_ties_card_cites_the_ties_paper(qtbot, window, demo_models, tmp_path):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    window.method.method.setCurrentIndex(window.method.method.findData("ties"))
    window.method.out_dir.setText(str(tmp_path / "ties"))
    merge(qtbot, window)
    card = (tmp_path / "ties" / "README.md").read_text()
    intro = card.split("- Base:")[0]
    assert "TIES-Merging" in intro and "2306.01708" in intro and "Behavior Knowledge Merge" not in intro


def test_the_proposed_output_folder_follows_the_method(qtbot, window, demo_models, tmp_path):
    import shutil

    models = tmp_path / "models"  # a copy: the outputs proposed next to it stay out of the shared demo
    base = shutil.copytree(demo_models[0], models / demo_models[0].name)
    agents = [shutil.copytree(p, models / p.name) for p in demo_models[1]]
    load_sources(qtbot, window, base, agents)
    assert window.method.out_dir.text() == str(models / "ram-plus-merged")
    merge(qtbot, window)
    window.method.method.setCurrentIndex(window.method.method.findData("ties"))
    assert window.method.out_dir.text() == str(models / "ties-merged")
    merge(qtbot, window)
    assert (models / "ram-plus-merged" / "merge-report.json").is_file()
    window.method.method.setCurrentIndex(window.method.method.findData("ram-plus"))
    assert window.method.out_dir.text() == str(models / "ram-plus-merged-2")  # the earlier output stays
    window.method.out_dir.setText(str(tmp_path / "mine"))  # a folder the user chose stays chosen
    window.method.method.setCurrentIndex(window.method.method.findData("ram"))
    assert window.method.out_dir.text() == str(tmp_path / "mine")


def test_with_a_failed_source_the_hint_does_not_say_click_analyze(qtbot, window, demo_models, tmp_path):
    from .conftest import drop_paths

    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    analyse(qtbot, window)
    broken = tmp_path / "broken.safetensors"  # as a Hub download that failed: a row marked ✗ error
    broken.write_bytes(b"\xff" * 5)
    drop_paths(window.sources, [broken])
    qtbot.waitUntil(lambda: not window.sources.busy and bool(window.sources.errors()), timeout=10000)
    hint = window.analysis.stale.text()
    assert not window.analyse_button.isEnabled() and hint and "click Analyze" not in hint
    window.sources.table.selectRow(4)
    qtbot.mouseClick(window.sources.remove_button, Qt.LeftButton)
    assert window.analyse_button.isEnabled()


def test_a_row_the_analysis_rejects_is_not_marked_ready(qtbot, window, demo_models, tmp_path):
    from tests.conftest import make_models

    base, agents = demo_models
    _, small = make_models(tmp_path / "small")  # another architecture, as a GPT-2 among Qwen2 agents
    load_sources(qtbot, window, base, [agents[0], small[0]])
    with qtbot.waitSignal(window.analysis_finished, timeout=30000) as blocker:
        qtbot.mouseClick(window.analyse_button, Qt.LeftButton)
    assert blocker.args == [False]
    status = [window.sources.table.item(r, 6).text() for r in range(3)]
    assert status == ["✓ ready", "✓ ready", "✗ rejected"], status
    assert "tensor names differ" in window.sources.table.item(2, 6).toolTip()
