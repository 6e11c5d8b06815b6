"""Regenerate the screenshots in docs/screenshots/ (headless):

    QT_QPA_PLATFORM=offscreen python docs/make_screenshots.py

Drives the real window through the main states with the built-in demo agents: sources loaded,
analysis (density and overlap), a merge under way, and the result; then Evaluate and Compare with
tiny transformers models (``--eval-only`` takes just those two).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from PySide6.QtCore import QEvent, QPointF, QSettings, Qt  # noqa: E402
from PySide6.QtGui import QMouseEvent  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402


def hover_cell(app, heatmap, agent: int, row: int, column: int) -> None:
    """Move the mouse over a heat map cell, as a user does (the read-out follows the pointer)."""
    scene = heatmap.cell_center(agent, row, column)
    view = heatmap.graphics
    pos = QPointF(view.mapFromScene(scene))
    event = QMouseEvent(QEvent.MouseMove, pos, view.viewport().mapToGlobal(pos), Qt.NoButton, Qt.NoButton,
                        Qt.NoModifier)
    app.sendEvent(view.viewport(), event)


def main() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="ram-shots-"))
    if "--eval-only" in sys.argv:
        app = QApplication([sys.argv[0]])
        from ram_desktop.gui import charts

        charts.configure()
        return evaluation_shots(app, ROOT / "screenshots", tmp)
    os.environ["RAM_DESKTOP_CACHE"] = str(tmp / "cache")  # a fresh demo and probe cache
    app = QApplication([sys.argv[0]])
    from ram_desktop.gui import charts
    from ram_desktop.gui.main_window import MainWindow, ensure_demo, wait_until

    charts.configure()
    out = ROOT / "screenshots"
    out.mkdir(exist_ok=True)
    window = MainWindow(QSettings(str(tmp / "settings.ini"), QSettings.IniFormat))
    window.resize(1360, 860)
    window.show()

    def shot(name: str) -> None:
        wait_until(lambda: window.analysis.charts_ready(), 10, app)
        wait_until(lambda: False, 0.3, app)
        path = out / f"{name}.png"
        window.grab().save(str(path), "PNG")
        print(f"{path} ({path.stat().st_size // 1024} KB)")

    base, agents = ensure_demo()
    window.set_sources(str(base), [str(a) for a in agents], None, analyse=False)
    window.method.out_dir.setText(str(tmp / "merged"))
    wait_until(lambda: window.sources.all_ready(), 20, app)
    shot("1-sources")

    window.analyse()
    wait_until(lambda: window.report is not None and window.job is None, 60, app)
    shot("2-analysis")
    window.analysis.tabs.setCurrentIndex(1)
    shot("2b-overlap")
    tabs = window.analysis.tabs
    views = [("2c-heatmap", window.analysis.heatmap), ("2d-tensors", window.analysis.tensors),
             ("2e-sets", window.analysis.intersections), ("2f-signs", window.analysis.pairs),
             ("2g-ulps", window.analysis.ulps), ("2h-would-keep", window.analysis.would_keep),
             ("2i-layers", window.analysis.layers)]
    for name, widget in views:
        tabs.setCurrentWidget(widget)
        if widget is window.analysis.heatmap:  # show the hover read-out of one cell
            hover_cell(app, widget, 1, 3, 1)
        if widget is window.analysis.tensors:  # sorted by the first agent's unique share
            widget.table.sortByColumn(5, Qt.DescendingOrder)
        shot(name)
    tabs.setCurrentIndex(0)

    window.chunk_elements = 256  # slow the tiny demo merge down so that it can be photographed
    window.method.set_out_dtype("float32")
    window.merge()
    wait_until(lambda: window.progress.format().startswith("Merging") and window.progress.value() > 400, 120, app)
    shot("3-merging")
    wait_until(lambda: not window.busy() and window.result is not None, 300, app)
    shot("4-result")
    window.close()
    return evaluation_shots(app, out, tmp)


def tiny_models(folder: Path) -> tuple[Path, list[Path]]:
    """A tiny transformers base and two agents that each move 30 % of the elements of two thirds of its
    tensors, one third shared: their updates overlap, so RAM+'s r matters (tests/tinylm.py)."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from tests.tinylm import write_tiny_lm

    base = write_tiny_lm(folder / "base", chat_template=False)
    agents = []
    for k, name in enumerate(("coder", "tool")):
        agent = folder / name
        shutil.copytree(base, agent)
        tensors = load_file(agent / "model.safetensors")
        gen = torch.Generator().manual_seed(k)
        for n in [n for i, n in enumerate(sorted(tensors)) if i % 3 in (k, 2)]:  # a third of them both move
            t = tensors[n]
            tensors[n] = t + 0.3 * torch.randn(t.shape, generator=gen) * (torch.rand(t.shape, generator=gen) < 0.3)
        save_file(tensors, str(agent / "model.safetensors"), metadata={"format": "pt"})
        agents.append(agent)
    return base, agents


VARIANTS = ("ram-plus:r=0", "ram-plus:r=0.1", "ram-plus:r=0.2", "task-arithmetic:scale=0.5")
# which model's greedy completion each example's answer is taken from, so that every bar means something
OWNERS = {"code": ["coder", "coder", "ram-plus_r=0.1", "coder", "base", "ram-plus_r=0.2"],
          "tools": ["tool", "tool", "ram-plus_r=0.2", "tool", "ram-plus_r=0.1", "task-arithmetic_scale=0.5"]}
PROMPTS = {"code": ["def add(a, b):", "def add(a, b): return", "What is 2 + 3?", "x = ", "return a +", "def f(x):"],
           "tools": ["tool call: search(query='weather')", "Say hello to the world", "tool call:", "search(query=",
                     "Remember the number 42", "Question: how many legs?"]}


def tiny_suites(folder: Path, base: Path, agents: list[Path]) -> list[Path]:
    """Two suites whose answers are pieces of greedy completions of the base, the agents and the variants the
    window will merge (merged here first with the same engine: the same bytes)."""
    import json

    from ram_desktop.core.session import Session, Variant
    from ram_desktop.evaluate import ModelRef, evaluate, load_suite
    from ram_desktop.evaluate.compare import compare

    session = Session(base=str(base), agents=[str(a) for a in agents], out_dtype="float32", device="cpu")
    made = compare(session, [Variant.parse(v) for v in VARIANTS], folder / "scratch")
    refs = [ModelRef("base", str(base))] + [ModelRef(a.name, str(a)) for a in agents]
    refs += [ModelRef(m.out.name, str(m.out)) for m in made.merges]
    names = [r.name for r in refs]
    suites = []
    for name, texts in PROMPTS.items():
        data = folder / name
        data.mkdir(parents=True)
        (data / "data.jsonl").write_text("".join(json.dumps({"prompt": p, "answer": "?"}) + "\n" for p in texts))
        (data / "suite.yaml").write_text(f"name: {name}\nscorer: contains\nmax_new_tokens: 6\nchat_template: false\n")
        done = evaluate(refs, [load_suite(data)], "cpu")
        rows = [{"prompt": p, "answer": done.completions[names.index(owner)][0][i][:3].strip() or "?"}
                for i, (p, owner) in enumerate(zip(texts, OWNERS[name]))]
        (data / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        suites.append(data)
    return suites


def evaluation_shots(app, out: Path, tmp: Path) -> int:
    """5-evaluate.png and 6-compare.png: a merge, a compare (RAM+ r sweep, TA) and an evaluation of them all."""
    from ram_desktop.gui.main_window import MainWindow, wait_until

    base, agents = tiny_models(tmp / "tiny")
    suites = tiny_suites(tmp / "suites", base, agents)
    window = MainWindow(QSettings(str(tmp / "settings-eval.ini"), QSettings.IniFormat))
    window.resize(1360, 860)
    window.show()
    window.set_sources(str(base), [str(a) for a in agents], None, analyse=True)
    wait_until(lambda: window.report is not None and window.job is None, 60, app)
    window.method.set_out_dtype("float32")
    window.method.out_dir.setText(str(tmp / "tiny" / "merged"))
    window.merge()
    wait_until(lambda: not window.busy() and window.result is not None, 120, app)
    window.evaluate.add_suites(suites)
    wait_until(lambda: len(window.evaluate.suites) == 2, 30, app)
    window.steps.setCurrentWidget(window.compare)
    window.compare.tick("ram-plus", "0, 0.1, 0.2", "r")
    window.compare.tick("task-arithmetic", "0.5", "scale")
    window.compare.folder.setText(str(tmp / "tiny" / "compare"))
    window.compare.start()
    wait_until(lambda: not window.busy(), 300, app)
    for name, widget in (("6-compare", window.compare), ("5-evaluate", window.evaluate)):
        window.steps.setCurrentWidget(widget)
        if widget is window.evaluate:  # the merged model too, on the same suites: one table
            window.evaluate.set_checked([window.result.out.name])
            window.evaluate.start()
            wait_until(lambda: not window.busy(), 120, app)
        wait_until(lambda: False, 0.3, app)
        path = out / f"{name}.png"
        window.grab().save(str(path), "PNG")
        print(f"{path} ({path.stat().st_size // 1024} KB)")
    window.close()
    return 0

if __name__ == "__main__":
    sys.exit(main())
