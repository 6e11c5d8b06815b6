"""Regenerate the screenshots in docs/screenshots/ (headless):

    QT_QPA_PLATFORM=offscreen python docs/make_screenshots.py

Drives the real window through the main states with the built-in demo agents: sources loaded, every
Analysis tab, a merge under way, and the result; the model card, Publish and Add from Hub dialogs; a mergekit
TIES configuration imported; a recipe with a layer map (layer stacking of the demo agents,
``3c-layer-map.png``); the filters editor and Settings ▸ Compute on an H100 machine; then Compare (RAM+ against
averaging, Task Arithmetic and TIES), Evaluate on the same demo with its test suites (seven models in
Compare's table and chart, eight in Evaluate's) and an eight-trial Search.
Every shot is taken at the default window size, 1360×860 (``docs/screenshots/*.png``), at a laptop's 1366×768
(``docs/screenshots/1366x768/``: the window must fit it) and at full HD, 1920×1080
(``docs/screenshots/1920x1080/``). ``--size 1366x768`` takes one size; ``--eval-only`` just Compare, Evaluate and
Search; ``--window-only`` all but those; ``--filters-only`` and ``--compute-only`` one dialog at 1360×860;
``--layer-map-only`` just the layer map.
``--real DIR`` instead opens the real model's base and three agents (``DIR/base``, ``DIR/{code,tool,memory}`` as
``benchmarks/make_real_agents.py`` writes them), analyses and merges them, and takes ``real-heatmap.png`` and
``real-result.png`` at 1360×860.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from PySide6.QtCore import QEvent, QPointF, QSettings, Qt
from PySide6.QtGui import QMouseEvent
from PySide6.QtWidgets import QApplication


def hover_cell(app, heatmap, agent: int, row: int, column: int) -> None:
    """Move the mouse over a heat map cell, as a user does (the read-out follows the pointer)."""
    scene = heatmap.cell_center(agent, row, column)
    view = heatmap.graphics
    pos = QPointF(view.mapFromScene(scene))
    event = QMouseEvent(
        QEvent.MouseMove, pos, view.viewport().mapToGlobal(pos), Qt.NoButton, Qt.NoButton, Qt.NoModifier
    )
    app.sendEvent(view.viewport(), event)


SIZES = {
    (1360, 860): ROOT / "screenshots",
    (1366, 768): ROOT / "screenshots" / "1366x768",  # a laptop: the window must fit it
    (1920, 1080): ROOT / "screenshots" / "1920x1080",
}


def save(window, path: Path) -> None:
    """The window as a PNG at the strongest compression, in its true colours (Qt's 256-colour conversion
    maps onto a fixed colour cube: the light shades of the charts came out as other colours)."""
    window.grab().save(str(path), "PNG", 0)
    print(f"{path} ({path.stat().st_size // 1024} KB)")


def main() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="ram-shots-"))
    os.environ["RAM_DESKTOP_CACHE"] = str(tmp / "cache")  # a fresh demo and probe cache
    app = QApplication([sys.argv[0]])
    from ram_desktop.gui.analysis import charts

    charts.configure()
    sizes = SIZES
    if "--size" in sys.argv:
        w, h = (int(v) for v in sys.argv[sys.argv.index("--size") + 1].split("x"))
        sizes = {(w, h): SIZES[(w, h)]}
    if "--filters-only" in sys.argv:
        filters_shot(app, SIZES[(1360, 860)], tmp)
        return 0
    if "--compute-only" in sys.argv:
        compute_shot(app, SIZES[(1360, 860)], tmp)
        return 0
    if "--real" in sys.argv:
        real_shots(app, Path(sys.argv[sys.argv.index("--real") + 1]), SIZES[(1360, 860)], tmp)
        return 0
    for (width, height), out in sizes.items():
        out.mkdir(parents=True, exist_ok=True)
        run = tmp / f"{width}x{height}"
        run.mkdir()
        os.environ["RAM_DESKTOP_OUTPUTS"] = str(run / "RAM Desktop")  # the demo's merges, not in the home folder
        if "--layer-map-only" in sys.argv:
            layer_map_shot(app, (width, height), out, run)
            continue
        if "--eval-only" not in sys.argv:
            window_shots(app, (width, height), out, run)
        if "--window-only" not in sys.argv:
            evaluation_shots(app, (width, height), out, run)
        if "--eval-only" not in sys.argv:  # the dialogs at every size: each must fit the smallest screen
            filters_shot(app, out, run)
            compute_shot(app, out, run)
            import_shot(app, (width, height), out, run)
    return 0


def window_shots(app, size: tuple[int, int], out: Path, tmp: Path) -> None:
    from ram_desktop.core.demo import ensure_demo
    from ram_desktop.gui.application import wait_until
    from ram_desktop.gui.main_window import MainWindow

    window = MainWindow(QSettings(str(tmp / "settings.ini"), QSettings.IniFormat))
    window.resize(*size)
    window.show()

    def shot(name: str) -> None:
        wait_until(lambda: window.analysis.charts_ready(), 10, app)
        wait_until(lambda: False, 0.3, app)
        save(window, out / f"{name}.png")

    base, agents = ensure_demo()
    window.set_sources(str(base), [str(a) for a in agents], None, analyse=False)
    window.method.out_dir.setText(str(tmp / "merged"))
    wait_until(lambda: window.sources.all_ready(), 20, app)
    shot("1-sources")

    window.analyse()
    wait_until(lambda: window.report is not None and not window.jobs.busy(), 60, app)
    shot("2-analysis")
    window.analysis.tabs.setCurrentIndex(1)
    shot("2b-overlap")
    tabs = window.analysis.tabs
    views = [
        ("2c-heatmap", window.analysis.heatmap),
        ("2d-tensors", window.analysis.tensors),
        ("2e-sets", window.analysis.intersections),
        ("2f-signs", window.analysis.pairs),
        ("2g-ulps", window.analysis.ulps),
        ("2h-would-keep", window.analysis.would_keep),
        ("2i-layers", window.analysis.layers),
    ]
    for name, widget in views:
        tabs.setCurrentWidget(widget)
        if widget is window.analysis.heatmap:  # show the hover read-out of one cell
            hover_cell(app, widget, 1, 3, 1)
        if widget is window.analysis.tensors:  # sorted by the first agent's unique share
            widget.table.sortByColumn(5, Qt.DescendingOrder)
        shot(name)
    tabs.setCurrentIndex(0)
    for name, page in (("5a-evaluate-tab", window.evaluate), ("6a-compare-tab", window.compare)):
        window.steps.setCurrentWidget(page)
        shot(name)
    window.steps.setCurrentWidget(window.analysis)
    window.method.set_method("della")  # three per-agent rows: the form scrolls, the window keeps its size
    shot("3a-della-form")
    window.method.set_method("slerp")  # one agent only: said in the form, with the fix
    shot("3b-slerp-refused")
    window.method.set_method("ram-plus")
    dialog = window.menus.reading_the_charts()
    wait_until(lambda: False, 0.3, app)
    save(dialog, out / "help-reading-the-charts.png")
    dialog.close()

    window.chunk_elements = 256  # slow the tiny demo merge down so that it can be photographed
    window.method.set_out_dtype("float32")
    window.merge()
    wait_until(lambda: window.progress.format().startswith("Merging") and window.progress.value() > 400, 120, app)
    shot("3-merging")
    wait_until(lambda: not window.busy() and window.result is not None, 300, app)
    shot("4-result")
    from ram_desktop.gui.ecosystem import PublishDialog

    window.result_box.open_card_button.click()  # the card, rendered inside the app
    from ram_desktop.gui.sources.hub_dialog import HubDialog

    for name, dialog in (
        ("4b-model-card", window.result_box.dialog),
        ("publish-dialog", PublishDialog(window, window.result.out)),
        ("hub-dialog", HubDialog(window, repo_id="HuggingFaceTB/SmolLM2-135M-Instruct")),
    ):
        dialog.show()
        wait_until(lambda: False, 0.3, app)
        save(dialog, out / f"{name}.png")
        dialog.close()
    window.close()
    layer_map_shot(app, size, out, tmp)


def layer_map_shot(app, size: tuple[int, int], out: Path, tmp: Path) -> None:
    """3c-layer-map.png: a recipe that stacks the demo agents' layers (passthrough, one slice scaled) opened with
    File ▸ Open recipe: the layer map read-only in the method form, the method set by it."""
    import yaml

    from ram_desktop.core.demo import ensure_demo
    from ram_desktop.gui.application import wait_until
    from ram_desktop.gui.main_window import MainWindow

    base, (coder, tool, memory) = ensure_demo()
    recipe = tmp / "stacked.yaml"
    slices = [
        {"sources": [{"model": 1, "layer_range": [0, 3]}]},
        {"sources": [{"model": 2, "layer_range": [1, 3]}]},
        {"sources": [{"model": 3, "layer_range": [0, 3]}], "parameters": {"scale": {"memory": 0.5}}},
    ]
    agents = [{"name": p.name, "source": str(p)} for p in (coder, tool, memory)]
    data = {"format": "ram-recipe/2", "method": "passthrough", "base": str(base), "agents": agents}
    recipe.write_text(yaml.safe_dump({**data, "out_dtype": "float32", "slices": slices}, sort_keys=False))
    window = MainWindow(QSettings(str(tmp / "settings-layer-map.ini"), QSettings.IniFormat))
    window.resize(*size)
    window.show()
    window.open_recipe(recipe)
    wait_until(lambda: window.sources.all_ready() and window.report is not None and not window.busy(), 60, app)
    window.method.out_dir.setText(str(tmp / "stacked"))
    wait_until(lambda: window.analysis.charts_ready(), 10, app)
    wait_until(lambda: False, 0.3, app)
    save(window, out / "3c-layer-map.png")
    window.close()


def filters_shot(app, out: Path, tmp: Path) -> None:
    """filters-dialog.png: the filters editor of Task Arithmetic's λ (Method and output ▸ lambda ▸ Filters…)
    on the demo, its second row selected (its gradient plotted)."""
    from ram_desktop.core.demo import ensure_demo
    from ram_desktop.gui.application import wait_until
    from ram_desktop.gui.main_window import MainWindow

    window = MainWindow(QSettings(str(tmp / "settings-filters.ini"), QSettings.IniFormat))
    window.resize(1360, 860)
    window.show()
    base, agents = ensure_demo()
    window.set_sources(str(base), [str(a) for a in agents], None, analyse=False)
    wait_until(lambda: window.sources.all_ready(), 20, app)
    lam = [{"filter": "mlp", "value": 0.5}, {"filter": "self_attn", "value": [0.2, 0.9]}, {"value": 1.0}]
    window.method.set_method("weighted-task-arithmetic", {"lambda": lam})
    dialog = window.method.fields["lambda"].widget.filters.open_editor()
    dialog.table.setCurrentCell(1, 1)
    wait_until(lambda: False, 0.3, app)
    save(dialog, out / "filters-dialog.png")
    dialog.reject()
    window.close()


def compute_shot(app, out: Path, tmp: Path) -> None:
    """compute-dialog.png: Settings ▸ Compute on a Linux machine with an NVIDIA H100 on driver 580 (the
    detection as recorded there, tests/compute_recordings.py), the plan that uses it."""
    from ram_desktop.core.compute.detect import Detection, NvidiaGpu
    from ram_desktop.gui.application import wait_until
    from ram_desktop.gui.compute.dialog import ComputePage
    from ram_desktop.gui.main_window import MainWindow

    os.environ["XDG_DATA_HOME"] = str(tmp / "data")  # no runtime folder installed
    window = MainWindow(QSettings(str(tmp / "settings-compute.ini"), QSettings.IniFormat))
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    found = Detection(
        "linux", "x86_64", python, (NvidiaGpu("NVIDIA H100 80GB HBM3", 81559, "580.159.04"),), "580.159.04", "13.0"
    )
    page = ComputePage(window, found)
    page.show()
    wait_until(lambda: False, 0.3, app)
    save(page, out / "compute-dialog.png")
    page.close()
    window.close()


def import_shot(app, size: tuple[int, int], out: Path, tmp: Path) -> None:
    """import-mergekit.png: File ▸ Import mergekit YAML… with a TIES configuration of the demo's agents (per-model
    weight and density): the window takes its method, per-agent values and sources, and says what differs."""
    from ram_desktop.core.demo import ensure_demo
    from ram_desktop.gui.application import wait_until
    from ram_desktop.gui.ecosystem import import_mergekit
    from ram_desktop.gui.main_window import MainWindow

    base, agents = ensure_demo()
    models = "".join(
        f"  - model: {agent}\n    parameters: {{weight: {w}, density: {d}}}\n"
        for agent, w, d in zip(agents, (1.0, 0.8, 0.6), (0.5, 0.4, 0.3))
    )
    config = tmp / "ties-demo.yaml"
    config.write_text(f"merge_method: ties\nbase_model: {base}\nmodels:\n{models}dtype: float32\n")
    window = MainWindow(QSettings(str(tmp / "settings-import.ini"), QSettings.IniFormat))
    window.resize(*size)
    window.show()
    assert import_mergekit(window, config)
    wait_until(lambda: window.sources.all_ready() and window.report is not None and not window.jobs.busy(), 60, app)
    wait_until(lambda: window.analysis.charts_ready(), 10, app)
    wait_until(lambda: False, 0.3, app)
    save(window, out / "import-mergekit.png")
    window.close()


def real_shots(app, folder: Path, out: Path, tmp: Path) -> None:
    """The window on the real model: SmolLM2-135M-Instruct and three fine-tunes of it, analysed and merged."""
    from ram_desktop.gui.application import wait_until
    from ram_desktop.gui.main_window import MainWindow

    window = MainWindow(QSettings(str(tmp / "settings.ini"), QSettings.IniFormat))
    window.resize(1360, 860)
    window.show()
    agents = [folder / name for name in ("code", "tool", "memory")]
    window.set_sources(str(folder / "base"), [str(a) for a in agents], None, analyse=False)
    window.method.out_dir.setText(str(tmp / "real-merged"))
    wait_until(lambda: window.sources.all_ready(), 60, app)
    window.analyse()
    wait_until(lambda: window.report is not None and not window.jobs.busy(), 600, app)
    window.analysis.tabs.setCurrentWidget(window.analysis.heatmap)
    wait_until(lambda: window.analysis.charts_ready(), 30, app)
    wait_until(lambda: False, 0.5, app)
    save(window, out / "real-heatmap.png")
    window.merge()
    wait_until(lambda: not window.busy() and window.result is not None, 600, app)
    wait_until(lambda: False, 0.5, app)
    save(window, out / "real-result.png")
    window.close()


VARIANTS = (("average", None, None), ("task-arithmetic", "0.3", "scale"), ("ties", "1.0", "scale"))  # beside RAM+


def evaluation_shots(app, size: tuple[int, int], out: Path, tmp: Path) -> None:
    """6-compare.png (its table), 6b-compare-chart.png, 5-evaluate.png (the table) and 5b-evaluate-chart.png
    on the built-in demo: the RAM+ merge, a compare against averaging, Task Arithmetic and TIES, and all
    eight models (base, three agents, the merge, three variants) scored on the agents' own test suites
    (preloaded by --demo); Evaluate reuses the scores Compare made, so only the merge is generated there. Then
    8-search.png: an eight-trial search on the demo's validation suites (the Search step)."""
    from ram_desktop.gui.application import wait_until
    from ram_desktop.gui.main_window import MainWindow

    window = MainWindow(QSettings(str(tmp / "settings-eval.ini"), QSettings.IniFormat))
    window.resize(*size)
    window.show()
    window.load_demo()
    wait_until(
        lambda: window.report is not None and not window.jobs.busy() and len(window.evaluate.suites) == 3, 120, app
    )
    window.merge()
    wait_until(lambda: not window.busy() and window.result is not None, 120, app)
    window.steps.setCurrentWidget(window.compare)
    window.compare.rows["ram-plus"].check.setChecked(False)  # ticked by default; the merge above is RAM+
    for method, values, param in VARIANTS:
        window.compare.tick(method, values, param)
    window.compare.run.start_button.click()  # as a user does: the window answers with the spec it shows
    wait_until(lambda: not window.busy(), 300, app)
    window.steps.setCurrentWidget(window.compare)
    wait_until(lambda: False, 0.3, app)
    save(window, out / "6-compare.png")
    window.compare.scores.views.setCurrentWidget(window.compare.chart)
    wait_until(lambda: False, 0.3, app)
    save(window, out / "6b-compare-chart.png")
    window.steps.setCurrentWidget(window.evaluate)
    models = window.evaluate.model_list  # base, agents, the merge and every compared variant on the same suites
    window.evaluate.set_checked([models.item(i).data(Qt.UserRole).name for i in range(models.count())])
    window.evaluate.start()
    wait_until(lambda: not window.busy(), 900, app)
    assert window.evaluate.table.rowCount() == 8, window.evaluate.table.rowCount()
    wait_until(lambda: False, 0.3, app)
    save(window, out / "5-evaluate.png")
    window.evaluate.scores.views.setCurrentWidget(window.evaluate.chart)
    wait_until(lambda: False, 0.3, app)
    save(window, out / "5b-evaluate-chart.png")
    window.steps.setCurrentWidget(window.search)  # a short search on the demo's validation suites
    window.search.trial_count.setValue(8)
    window.search.run.start_button.click()
    wait_until(lambda: not window.busy(), 600, app)
    window.steps.setCurrentWidget(window.search)
    wait_until(lambda: False, 0.3, app)
    save(window, out / "8-search.png")
    window.close()


if __name__ == "__main__":
    sys.exit(main())
