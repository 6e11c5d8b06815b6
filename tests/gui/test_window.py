"""The window driven through its widgets on the offscreen platform."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import pytest
from PySide6.QtCore import Qt, QTimer
from safetensors import safe_open

from ram_desktop.core import MergeSpec
from ram_desktop.core.methods import METHODS

from ..conftest import make_models
from .conftest import analyse, drop_paths, load_sources, merge


def _lambda_column(window) -> list[str]:
    return [window.analysis.table.item(r, 5).text() for r in range(window.analysis.table.rowCount())]


def test_add_sources_by_drop_then_analyse_shows_charts_and_table(qtbot, window, demo_models):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    table = window.sources.table
    assert table.rowCount() == 4
    assert [table.item(r, 1).text() for r in range(1, 4)] == ["coder", "tool", "memory"]
    tensors = len(safe_open(str(base / "model.safetensors"), "pt").keys())
    assert table.item(0, 5).text() == "BF16" and table.item(1, 4).text() == str(tensors)
    assert all(table.item(r, 6).text() == "✓ ready" for r in range(4))
    assert window.method.out_dir.text().endswith("merged")  # a sensible default output folder

    analyse(qtbot, window)
    report = window.report
    assert report is not None and report.names == ["coder", "tool", "memory"]
    assert window.analysis.table.rowCount() == 3
    qtbot.waitUntil(window.analysis.charts_ready, timeout=5000)  # charts after the first are drawn one per turn
    assert len(window.analysis.overlap.pies) == 3
    assert window.analysis.overlap.pies[2].values == [float(v) for v in report.agents[2].overlap]
    bars = [i for i in window.analysis.density.plot.items if type(i).__name__ == "BarGraphItem"]
    assert len(bars) == 6  # unique + shared per agent
    assert window.analysis.table.item(2, 4).text() == f"{report.agents[2].rho:.3f}"


def test_changing_r_updates_lambda_instantly(qtbot, window, demo_models):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    analyse(qtbot, window)
    before = _lambda_column(window)
    field = window.method.fields["r"].widget
    field.selectAll()
    qtbot.keyClicks(field, "0.2")  # typing, as a user does; no new analysis runs
    assert not window.jobs.busy()
    after = _lambda_column(window)
    rhos = [a.rho for a in window.report.agents]
    assert after != before
    assert after == [f"{1 + 0.2 * min(max(rho, 0.0), 2.0):.4f}" for rho in rhos]
    alpha = window.method.fields["alpha"].widget
    alpha.setValue(1.0)
    assert _lambda_column(window) == [f"{1 + 0.2 * min(rho, 1.0):.4f}" for rho in rhos]


def test_rounding_warning_for_ram_plus_in_bf16_and_the_float32_fix(qtbot, window, tmp_path):
    # synthetic agents whose updates are 1-3 bf16 ulps, where the rescale rounds away (the demo's
    # real agents moved by more, so RAM+ in bf16 keeps most of their rescale: no warning there)
    base, agents = make_models(tmp_path / "ulp-agents")
    load_sources(qtbot, window, base, agents)
    analyse(qtbot, window)
    assert window.analysis.warning.isVisible()
    assert "bfloat16" in window.analysis.warning_text.text()
    qtbot.mouseClick(window.analysis.warning_fix, Qt.LeftButton)
    assert window.method.out_dtype.currentData() == "float32"
    assert not window.analysis.warning.isVisible()
    window.method.set_method("ram")  # RAM does not rescale: nothing to warn about
    window.method.set_out_dtype("bfloat16")
    assert not window.analysis.warning.isVisible()


def test_method_form_is_generated_from_the_registry(window):
    combo = window.method.method
    offered = {
        name: m for name, m in METHODS.items() if not m.streaming.stacks
    }  # stacking needs a layer map: offered only while a file's map is shown (test_layer_map.py)
    assert [combo.itemData(i) for i in range(combo.count())] == list(offered)
    assert len(offered) == len(METHODS) - 1
    for i, (_name, method) in enumerate(offered.items()):
        combo.setCurrentIndex(i)
        assert list(window.method.fields) == [p.name for p in method.params]
        for p in method.params:
            w = window.method.fields[p.name].widget
            assert p.describe() in w.toolTip()
        assert window.method.params() == {p.name: p.default for p in method.params}


def test_merge_the_demo_and_find_the_output_folder(qtbot, window, demo_models, tmp_path):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    analyse(qtbot, window)
    out = tmp_path / "merged"
    window.method.out_dir.setText(str(out))
    window.method.set_out_dtype("float32")
    merge(qtbot, window)
    for name in (
        "model.safetensors",
        "config.json",
        "README.md",
        "ram-recipe.yaml",
        "merge-report.json",
        "density.png",
        "overlap.png",
        "layers.png",
    ):
        assert (out / name).is_file(), name
    assert str(out) in window.result_text.text()
    assert window.open_folder_button.isEnabled()
    report = json.loads((out / "merge-report.json").read_text())
    assert report["method"] == "ram-plus" and len(report["lambda"]) == 3
    assert window.progress.value() == 1000


def _slow_merge(window, out: Path) -> None:
    window.chunk_elements = 1024  # many small chunks: the merge of the synthetic agents lasts a few seconds
    window.method.out_dir.setText(str(out))
    window.method.set_method("ram")  # no probe pass: progress events come from the merge itself


def test_cancel_mid_merge_leaves_nothing_behind(qtbot, window, synthetic_models, tmp_path):
    base, agents = synthetic_models
    load_sources(qtbot, window, base, agents)
    out = tmp_path / "out" / "merged"
    _slow_merge(window, out)
    with qtbot.waitSignal(window.merge_finished, timeout=60000) as blocker:
        qtbot.mouseClick(window.merge_button, Qt.LeftButton)
        # as a user would: wait until the bar shows the merge under way, then press Cancel
        qtbot.waitUntil(
            lambda: window.progress.format().startswith("Merging") and 50 < window.progress.value() < 900, timeout=30000
        )
        qtbot.mouseClick(window.cancel_button, Qt.LeftButton)
    assert blocker.args == ["cancelled"]
    assert not out.exists()
    assert not (tmp_path / "out").exists()  # no partial folder either, nor the parent the merge created
    assert "nothing was written" in window.message.text.text()
    assert window.merge_button.isEnabled() and not window.cancel_button.isEnabled()


@pytest.mark.serial  # a timing bound: measured with the machine to itself (Makefile)
def test_event_loop_never_stalls_during_a_merge(qtbot, window, synthetic_models, tmp_path):
    """A 5 ms heartbeat timer on the GUI thread; the longest gap between beats is the worst stall."""
    base, agents = synthetic_models
    load_sources(qtbot, window, base, agents)
    analyse(qtbot, window)
    qtbot.waitUntil(window.analysis.charts_ready)  # the analysis's drawing is over: only the merge is measured
    window.chunk_elements = 512
    window.method.out_dir.setText(str(tmp_path / "merged"))
    beats: list[float] = []
    timer = QTimer()
    timer.setInterval(5)
    timer.timeout.connect(lambda: beats.append(time.perf_counter()))
    timer.start()
    qtbot.wait(50)
    with qtbot.waitSignal(window.merge_finished, timeout=60000) as blocker:
        qtbot.mouseClick(window.merge_button, Qt.LeftButton)
    qtbot.wait(50)
    timer.stop()
    assert blocker.args == ["done"], window.message.text.text()
    gaps = [b - a for a, b in itertools.pairwise(beats)]
    worst = max(gaps)
    print(f"heartbeat: {len(beats)} beats, longest event-loop stall {1000 * worst:.1f} ms")
    assert beats[-1] - beats[0] > 0.5  # the merge really ran for a while
    assert worst <= 0.1


def test_open_a_saved_recipe(qtbot, window, settings, demo_models, tmp_path):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    window.sources.table.item(1, 1).setText("coding")  # rename an agent in the table
    window.method.set_method("ram-plus-soft", {"r": 0.15})
    window.method.set_out_dtype("float32")
    path = tmp_path / "ram-recipe.yaml"
    assert window.save_recipe(path)
    recipe = MergeSpec.load(path)
    assert recipe.names == ["coding", "tool", "memory"] and recipe.method == "ram-plus-soft"
    assert recipe.params == {"r": 0.15}

    from ram_desktop.gui.main_window import MainWindow

    other = MainWindow(settings)
    qtbot.addWidget(other)
    with qtbot.waitSignal(other.analysis_finished, timeout=30000) as blocker:
        assert other.open_recipe(path)
    assert blocker.args == [True]
    assert other.sources.names == ["coding", "tool", "memory"]
    assert other.method.current.name == "ram-plus-soft"
    assert other.method.params() == {"r": pytest.approx(0.15)}
    assert other.method.out_dtype.currentData() == "float32"
    assert other.menus.recent_recipes()[0] == str(path.resolve())
    assert other.menus.recent_menu.actions()[0].text() == str(path.resolve())
    other.close()


def test_bad_source_shows_a_readable_error(qtbot, window, demo_models, tmp_path):
    base, agents = demo_models
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    (empty / "notes.txt").write_text("hello")
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"\xff" * 5)
    drop_paths(window.sources, [base, empty, broken])
    qtbot.waitUntil(lambda: not window.sources.busy and len(window.sources.errors()) == 2, timeout=10000)
    table = window.sources.table
    assert table.item(1, 6).text() == "✗ error" and table.item(2, 6).text() == "✗ error"
    assert window.message.isVisible() and window.message.kind == "error"
    text = window.message.text.text()
    assert "Traceback" not in text and ("broken.safetensors" in text or "not-a-model" in text)
    assert not window.analyse_button.isEnabled() and not window.merge_button.isEnabled()
    # removing the bad rows makes the set usable again
    for _ in range(2):
        table.selectRow(1)
        qtbot.mouseClick(window.sources.remove_button, Qt.LeftButton)
    drop_paths(window.sources, agents[:2])
    qtbot.waitUntil(lambda: window.analyse_button.isEnabled(), timeout=10000)


def test_mismatched_agent_fails_analysis_with_a_message(qtbot, window, demo_models, tmp_path):
    from tests.conftest import make_models

    base, agents = demo_models
    _, small = make_models(tmp_path / "small")  # another architecture: shapes differ
    load_sources(qtbot, window, base, [agents[0], small[0]])
    with qtbot.waitSignal(window.analysis_finished, timeout=30000) as blocker:
        qtbot.mouseClick(window.analyse_button, Qt.LeftButton)
    assert blocker.args == [False]
    assert window.message.kind == "error" and "tensor names differ" in window.message.text.text()
    assert "tensor names differ" in window.log_view.toPlainText()


def test_reorder_and_remove_agents(qtbot, window, demo_models):
    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    window.sources.table.selectRow(3)
    qtbot.mouseClick(window.sources.up_button, Qt.LeftButton)
    assert window.sources.names == ["coder", "memory", "tool"]
    qtbot.mouseClick(window.sources.remove_button, Qt.LeftButton)  # the moved row stays selected
    assert window.sources.names == ["coder", "tool"]


def test_settings_persist_geometry_folders_and_device(qtbot, settings):
    from ram_desktop.gui.main_window import MainWindow

    first = MainWindow(settings)
    qtbot.addWidget(first)
    first.resize(640, 480)
    first.method.device.setCurrentIndex(first.method.device.findData("cpu"))
    first.sources._remember("/tmp/some/model")
    first.close()
    second = MainWindow(settings)
    qtbot.addWidget(second)
    assert (second.width(), second.height()) == (640, 480)
    assert second.method.device.currentData() == "cpu"
    assert second.sources.browse_dir == "/tmp/some"
    second.close()


def test_a_bug_on_the_gui_thread_shows_a_dialog_and_is_logged(qtbot, window, monkeypatch, caplog):
    import sys

    from PySide6.QtWidgets import QMessageBox

    from ram_desktop.gui.app import install_excepthook

    shown = []
    monkeypatch.setattr(QMessageBox, "exec", lambda self: shown.append((self.text(), self.detailedText())) or 0)
    saved = sys.excepthook
    try:
        install_excepthook()
        try:
            raise ZeroDivisionError("boom")
        except ZeroDivisionError:
            sys.excepthook(*sys.exc_info())
    finally:
        sys.excepthook = saved
    assert shown and "ZeroDivisionError: boom" in shown[0][0] and "Traceback" in shown[0][1]
    assert "unexpected error" in caplog.text


def test_a_bug_in_the_worker_becomes_a_message_and_the_window_stays_usable(qtbot, window, demo_models, monkeypatch):
    from ram_desktop import workflow

    base, agents = demo_models
    load_sources(qtbot, window, base, agents)

    def broken(*args, **kwargs):
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(workflow, "analyse", broken)
    with qtbot.waitSignal(window.analysis_finished, timeout=10000) as blocker:
        qtbot.mouseClick(window.analyse_button, Qt.LeftButton)
    assert blocker.args == [False]
    assert window.message.kind == "error" and "simulated bug" in window.message.text.text()
    assert "Traceback" not in window.message.text.text()
    assert "RuntimeError" in window.log_view.toPlainText()
    assert window.analyse_button.isEnabled() and window.merge_button.isEnabled()


@pytest.mark.serial  # a timing bound: measured with the machine to itself (Makefile)
def test_closing_the_window_mid_merge_cancels_quickly_and_leaves_nothing(qtbot, window, synthetic_models, tmp_path):
    base, agents = synthetic_models
    load_sources(qtbot, window, base, agents)
    out = tmp_path / "out" / "merged"
    _slow_merge(window, out)
    qtbot.mouseClick(window.merge_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: 50 < window.progress.value() < 900, timeout=30000)
    start = time.perf_counter()
    window.close()
    assert time.perf_counter() - start < 2.0
    qtbot.waitUntil(lambda: not window.jobs.busy(), timeout=5000)
    # nothing left: no staging folder, and not the parent folder the merge created for its output
    assert not out.exists() and not (tmp_path / "out").exists()


def test_export_charts_as_png(qtbot, window, demo_models, tmp_path, monkeypatch):
    from PySide6.QtWidgets import QFileDialog

    base, agents = demo_models
    load_sources(qtbot, window, base, agents)
    analyse(qtbot, window)
    qtbot.waitUntil(window.analysis.charts_ready, timeout=5000)
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: str(tmp_path))
    window.menus.export_action.trigger()
    for name in ("density.png", "overlap.png", "layers.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"


def test_cached_demo_is_replaced_when_the_shipped_demo_changes(tmp_path, monkeypatch):
    """The window copies the demo into the cache once; an update that ships other agents must replace
    that copy (a stale cache kept showing the previous round's agents), and an unchanged one is reused."""
    import hashlib
    import shutil

    from ram_desktop.core import demo as demo_module

    shipped = tmp_path / "shipped"
    shutil.copytree(demo_module.demo_resources(), shipped, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(demo_module, "demo_resources", lambda: shipped)
    cache = tmp_path / "cache" / "demo"

    def weights_digest(folder: Path) -> str:
        return hashlib.sha256((folder / "tool" / "model.safetensors").read_bytes()).hexdigest()

    base, agents = demo_module.ensure_demo(cache)
    assert weights_digest(cache) == weights_digest(shipped)
    weights = cache / "base" / "model.safetensors"
    copied = weights.stat().st_ino
    assert demo_module.ensure_demo(cache) == (base, agents) and weights.stat().st_ino == copied  # reused
    marker = cache / "base" / "marker"  # a file the shipped demo does not have: the copy is not the demo's
    marker.write_text("not part of the demo")
    assert demo_module.ensure_demo(cache) == (base, agents) and not marker.exists()

    # an update: the tool agent's weights and recipe change
    other = bytearray((shipped / "tool" / "model.safetensors").read_bytes())
    other[-1] ^= 0x01
    (shipped / "tool" / "model.safetensors").write_bytes(bytes(other))
    demo_module.ensure_demo(cache)
    assert not marker.exists() and weights_digest(cache) == weights_digest(shipped)

    # a cache written before the stamp existed is refreshed once, then reused
    (cache / demo_module.SHIPPED_STAMP).unlink()
    marker.write_text("x")
    demo_module.ensure_demo(cache)
    assert not marker.exists() and (cache / demo_module.SHIPPED_STAMP).read_text() == demo_module.demo_fingerprint(
        shipped
    )
