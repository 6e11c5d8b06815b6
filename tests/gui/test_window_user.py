"""The window as a user meets it (docs/gui.md): the model card shown inside the app, where the output folder
is when no file manager opens, a visible folder for the demo's merges, a Publish dialog whose fields are not
cut, progress lines that stay inside their panel, a refused row that says it blocks the merge and stops
blocking once removed, refusals in the log."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication

from ram_desktop import paths
from ram_desktop.gui import ecosystem
from ram_desktop.gui.widgets import open_dialogs

from .conftest import analyse, load_sources, merge


@pytest.fixture
def no_launcher(monkeypatch):
    """A desktop without a file manager or editor: every QDesktopServices.openUrl fails (and is recorded)."""
    calls = []

    def refuse(url):
        calls.append(url.toLocalFile())
        return False

    monkeypatch.setattr(open_dialogs.QDesktopServices, "openUrl", refuse)
    return calls


@pytest.fixture
def merged(qtbot, window, demo_models, tmp_path):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    analyse(qtbot, window)
    out = tmp_path / "merged"
    window.method.out_dir.setText(str(out))
    merge(qtbot, window)
    return out


def test_open_model_card_shows_the_card_inside_the_window(qtbot, window, merged, no_launcher):
    qtbot.mouseClick(window.result_box.open_card_button, Qt.LeftButton)
    dialog = window.result_box.dialog
    assert isinstance(dialog, open_dialogs.CardDialog) and dialog.isVisible()
    assert no_launcher == []  # shown here, not handed to a launcher that may not exist
    card = (merged / "README.md").read_text()
    heading = next(line for line in card.splitlines() if line.startswith("# "))[2:].strip()
    shown = dialog.browser.toPlainText()
    assert heading in shown and "# " + heading not in shown  # rendered Markdown, not its source
    assert "base_model:" not in shown  # the Hub's metadata block is not part of what a reader sees
    assert dialog.path.text() == str(merged / "README.md") and dialog.path.isReadOnly()
    qtbot.mouseClick(dialog.editor_button, Qt.LeftButton)  # no editor either: it says so, in the dialog
    assert no_launcher == [str(merged / "README.md")] and dialog.note.isVisible()


def test_open_output_folder_without_a_file_manager_says_where_it_is(qtbot, window, merged, no_launcher):
    qtbot.mouseClick(window.open_folder_button, Qt.LeftButton)
    assert no_launcher == [str(merged)]
    dialog = window.result_box.dialog
    assert isinstance(dialog, open_dialogs.FolderDialog) and dialog.isVisible()
    assert dialog.path.text() == str(merged) and dialog.path.isReadOnly()
    QGuiApplication.clipboard().setText("")
    qtbot.mouseClick(dialog.copy_button, Qt.LeftButton)
    assert QGuiApplication.clipboard().text() == str(merged)


def test_the_demo_proposes_a_visible_output_folder(qtbot, window):
    with qtbot.waitSignal(window.analysis_finished, timeout=120000):
        window.load_demo()
    out = Path(window.method.out_dir.text())
    assert out.parent == paths.outputs_dir() / "demo" and out.name == "ram-plus-merged"
    assert not any(part.startswith(".") for part in out.parts), out  # never a hidden (cache) folder
    assert Path(window.compare.folder.text()).parent == paths.outputs_dir() / "demo"


def test_outputs_folder_is_visible_in_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("RAM_DESKTOP_OUTPUTS", raising=False)
    monkeypatch.delenv("XDG_DOCUMENTS_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert paths.outputs_dir() == tmp_path / "RAM Desktop"  # no Documents folder
    (tmp_path / "Documents").mkdir()
    assert paths.outputs_dir() == tmp_path / "Documents" / "RAM Desktop"
    monkeypatch.setenv("XDG_DOCUMENTS_DIR", str(tmp_path / "Dokumente"))
    (tmp_path / "Dokumente").mkdir()
    assert paths.outputs_dir() == tmp_path / "Dokumente" / "RAM Desktop"
    assert not (tmp_path / "Dokumente" / "RAM Desktop").exists()  # created only when asked


def test_publish_dialog_fields_are_not_cut(qtbot, window, tmp_path):
    dialog = ecosystem.PublishDialog(window, tmp_path)
    qtbot.addWidget(dialog)
    dialog.show()
    qtbot.waitExposed(dialog)
    assert dialog.width() >= 520
    token = dialog.token_edit
    placeholder = token.placeholderText()
    assert placeholder and token.width() >= token.fontMetrics().horizontalAdvance(placeholder) + 12


def test_progress_lines_stay_inside_their_panel(qtbot, window):
    window.resize(1360, 860)
    qtbot.wait(50)
    long = "Scored 8 models on 3 suites in 18 s · scores written to " + ", ".join(
        f"/tmp/a-long-folder-name/variant_{i}" for i in range(12)
    )
    labels = [window.progress_label, window.evaluate.run.label]
    window.run_box.show_state(500, "x", long)
    window.evaluate.run.label.setText(long)
    window.steps.setCurrentWidget(window.evaluate)
    qtbot.wait(50)
    for label in labels:
        shown = label.displayed()
        assert shown.endswith("…") and long.startswith(shown[:-1])
        assert label.fontMetrics().horizontalAdvance(shown) <= label.contentsRect().width()
        assert label.geometry().right() <= label.parentWidget().width()
        assert label.toolTip() == long  # the whole line on hover


def test_a_refused_row_blocks_the_merge_by_name_until_removed(qtbot, window, demo_models, tmp_path):
    from tests.conftest import make_models

    base, agents = demo_models
    _, small = make_models(tmp_path / "small")  # another architecture, as a GPT-2 among Qwen2 agents
    load_sources(qtbot, window, base, [agents[0], small[0]])
    with qtbot.waitSignal(window.analysis_finished, timeout=30000) as blocker:
        qtbot.mouseClick(window.analyse_button, Qt.LeftButton)
    assert blocker.args == [False]
    name = window.sources.agents[1].name
    assert not window.merge_button.isEnabled()  # Merge is not offered; its tooltip names the row and the fix
    tip = window.merge_button.toolTip()
    assert f"agent 2 ({name}) does not fit the base" in tip and "tensor names differ" in tip and "Remove" in tip
    qtbot.mouseClick(window.merge_button, Qt.LeftButton)
    assert not window.busy()  # nothing started
    qtbot.waitUntil(lambda: f"agent 2 ({name}) does not fit the base" in window.log_view.toPlainText(), timeout=5000)
    # the user removes the refused row: the others analyse and merge
    window.sources.table.selectRow(2)
    qtbot.mouseClick(window.sources.remove_button, Qt.LeftButton)
    assert [window.sources.table.item(r, 6).text() for r in range(2)] == ["✓ ready", "✓ ready"]
    analyse(qtbot, window)
    window.method.out_dir.setText(str(tmp_path / "merged"))
    merge(qtbot, window)


def test_window_refusals_reach_the_log_once(qtbot, window, demo_models, tmp_path):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    analyse(qtbot, window)
    window.method.eps.setText("not a number")
    qtbot.mouseClick(window.merge_button, Qt.LeftButton)
    shown = window.message.text.text().removeprefix("Error: ")
    assert shown
    qtbot.waitUntil(lambda: shown in window.log_view.toPlainText(), timeout=5000)
    assert window.log_view.toPlainText().count(shown) == 1
