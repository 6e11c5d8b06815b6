"""The window's menus: File (recipes and the recent ones, charts, mergekit, the demo, quit) and Help,
with the file dialogs and the recipe files behind them."""

from __future__ import annotations

import html
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Qt, QUrl
from PySide6.QtGui import QAction, QDesktopServices, QKeySequence
from PySide6.QtWidgets import QDialog, QFileDialog, QMessageBox, QTextBrowser, QVBoxLayout

from .. import __version__
from ..core import InputError, is_mergekit_file
from ..paths import visible_folder
from . import ecosystem
from .analysis.panel import reading_the_charts
from .compute.dialog import about_lines
from .method.spec_form import load_spec, write_from_recipe

MainWindow = Any  # the main window (not imported: main_window imports this module)

log = logging.getLogger("ram_desktop")
MAX_RECENT = 8
PAPER_URL = "https://arxiv.org/abs/2601.13572"


def _action(
    text: str, parent: QObject, triggered: Callable[..., object], shortcut: QKeySequence.StandardKey | None = None
) -> QAction:
    """A menu action that calls ``triggered`` (PySide6's ``shortcut=``/``triggered=`` keywords, spelled out
    so that they type-check)."""
    action = QAction(text, parent)
    if shortcut is not None:
        action.setShortcut(shortcut)
    action.triggered.connect(triggered)
    return action


class Menus(QObject):
    """Builds the window's menu bar, opens and saves recipes (``recipe_path``: the last one) and keeps
    the recent ones (in the window's settings)."""

    def __init__(self, window: MainWindow) -> None:
        super().__init__(window)
        self.window = w = window
        self.recipe_path: Path | None = None
        file_menu = w.menuBar().addMenu("&File")
        self.open_action = _action("&Open recipe…", w, self.open_recipe_dialog, QKeySequence.StandardKey.Open)
        self.save_action = _action("&Save recipe…", w, self.save_recipe_dialog, QKeySequence.StandardKey.Save)
        self.export_action = _action("&Export charts as PNG…", w, self.export_charts_dialog)
        self.export_action.setToolTip(
            "Save every analysis chart (density, overlap, heat map, tensors, sets, signs, "
            "ulps, would keep, per layer) into a folder"
        )
        self.demo_action = _action("Load &demo agents", w, w.load_demo)
        self.demo_action.setToolTip("A small real base and three agents RL-trained from it: merge them within a minute")
        self.import_mergekit_action = _action("&Import mergekit YAML…", w, lambda: ecosystem.import_mergekit_dialog(w))
        self.export_mergekit_action = _action("Export &mergekit YAML…", w, lambda: ecosystem.export_mergekit_dialog(w))
        self.recent_menu = file_menu.addMenu("Open &recent")
        quit_action = _action("&Quit", w, w.close, QKeySequence.StandardKey.Quit)
        file_menu.insertAction(self.recent_menu.menuAction(), self.open_action)
        file_menu.addAction(self.save_action)
        file_menu.addAction(self.export_action)
        file_menu.addSeparator()
        file_menu.addAction(self.import_mergekit_action)
        file_menu.addAction(self.export_mergekit_action)
        file_menu.addSeparator()
        file_menu.addAction(self.demo_action)
        file_menu.addSeparator()
        file_menu.addAction(quit_action)
        # the run's buttons by keyboard (the button's own state decides whether it runs)
        self.run_menu = w.menuBar().addMenu("&Run")
        for text, key, button in (
            ("&Analyze", "F5", w.analyse_button),
            ("&Merge", "Ctrl+M", w.merge_button),
            ("&Evaluate", "Ctrl+E", w.evaluate.run.start_button),
            ("&Cancel", "Esc", w.cancel_button),
        ):
            action = QAction(text, w)
            action.setShortcut(QKeySequence(key))
            action.triggered.connect(lambda _=False, b=button: b.click() if b.isEnabled() else None)
            self.run_menu.addAction(action)
            keys = QKeySequence(key).toString(QKeySequence.SequenceFormat.NativeText)
            button.setToolTip(f"{button.toolTip()} ({keys})")
        self.cancel_action = self.run_menu.actions()[-1]
        self.cancel_action.setEnabled(False)  # Esc reaches editors and dialogs unless a job runs
        settings_menu = w.menuBar().addMenu("&Settings")
        self.compute_action = _action("&Compute…", w, lambda: w.compute.open_page())
        self.compute_action.setToolTip("Detect the GPU and fetch the torch build that uses it (docs/compute.md)")
        settings_menu.addAction(self.compute_action)
        self.help_menu = help_menu = w.menuBar().addMenu("&Help")
        help_menu.addAction(
            _action("&Reading the charts", w, self.reading_the_charts, QKeySequence.StandardKey.HelpContents)
        )
        help_menu.addAction(
            _action("The RAM paper (arXiv 2601.13572)", w, lambda: QDesktopServices.openUrl(QUrl(PAPER_URL)))
        )
        help_menu.addAction(_action("&About RAM Desktop", w, self._about))
        self._rebuild_recent()

    def set_busy(self, busy: bool) -> None:
        """While a job runs nothing that changes the inputs can be started."""
        for action in (
            self.open_action,
            self.save_action,
            self.demo_action,
            self.export_action,
            self.import_mergekit_action,
            self.export_mergekit_action,
        ):
            action.setEnabled(not busy)
        self.recent_menu.setEnabled(not busy and bool(self.recent_recipes()))
        self.cancel_action.setEnabled(busy)

    def reading_the_charts(self) -> QDialog:
        """A window beside the main one that explains every analysis chart (from the chart registry)."""
        dialog = QDialog(self.window)
        dialog.setWindowTitle("Reading the charts")
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        text = QTextBrowser()
        text.setHtml(reading_the_charts())
        layout = QVBoxLayout(dialog)
        layout.addWidget(text)
        dialog.resize(560, 620)
        dialog.show()
        return dialog

    def _about(self) -> None:
        QMessageBox.about(
            self.window,
            "About RAM Desktop",
            f"<b>RAM Desktop {__version__}</b><p>Merges RL-trained agents that share one base with "
            "RAM / RAM+ (Behavior Knowledge Merge in Reinforced Agentic Models, arXiv 2601.13572) "
            "and classic baselines.</p><p>" + "<br>".join(html.escape(line) for line in about_lines()) + "</p>",
        )

    # --- recent recipes -----------------------------------------------------------------------
    def recent_recipes(self) -> list[str]:
        value = self.window.settings.value("recent/recipes", [])
        if isinstance(value, str):
            value = [value]
        return [str(v) for v in (value or [])]

    def add_recent(self, path: Path) -> None:
        items = [str(path)] + [p for p in self.recent_recipes() if p != str(path)]
        self.window.settings.setValue("recent/recipes", items[:MAX_RECENT])
        self._rebuild_recent()

    def _rebuild_recent(self) -> None:
        self.recent_menu.clear()
        items = self.recent_recipes()
        for path in items:
            self.recent_menu.addAction(_action(path, self.window, lambda _=False, p=path: self.open_recipe(Path(p))))
        self.recent_menu.setEnabled(bool(items))

    # --- recipe files -------------------------------------------------------------------------
    def open_recipe(self, path: Path) -> bool:
        """Load a recipe into the window: every value is checked first, so a bad recipe changes nothing."""
        w = self.window
        if w.busy():
            return False
        try:
            w.apply_spec(load_spec(path))
        except InputError as e:
            if is_mergekit_file(Path(path)):
                w.show_error(f"{path} is a mergekit configuration, not a RAM Desktop recipe")
                w.message.offer("Import as mergekit YAML", lambda: ecosystem.import_mergekit(w, Path(path)))
            else:
                w.show_error(str(e))
            return False
        self._used(path)
        w.title.set(Path(path).name)  # Qt appends " — RAM Desktop"
        log.info("opened recipe %s", path)
        return True

    def save_recipe(self, path: Path) -> bool:
        w = self.window
        if not write_from_recipe(w, path, lambda recipe, p: recipe.save(p), "saving a recipe", "the recipe"):
            return False
        self._used(path)
        log.info("saved recipe %s", path)
        w.statusBar().showMessage(f"Saved {path}", 8000)
        return True

    def _used(self, path: Path) -> None:
        self.recipe_path = Path(path)
        self.add_recent(Path(path).resolve())

    # --- file dialogs -------------------------------------------------------------------------
    def open_recipe_dialog(self) -> None:
        w = self.window
        start = str(self.recipe_path.parent) if self.recipe_path else w.sources.browse_dir
        path, _ = QFileDialog.getOpenFileName(w, "Open recipe", start, "RAM recipes (*.yaml *.yml);;All files (*)")
        if path:
            self.open_recipe(Path(path))

    def save_folder(self) -> str:
        """Where the Save and Export dialogs start: the last recipe's folder or the last folder browsed, where
        visible; else Documents/RAM Desktop (never a hidden cache folder a mergekit import came from)."""
        folder = self.recipe_path.parent if self.recipe_path else Path(self.window.sources.browse_dir)
        return str(visible_folder(folder))

    def save_recipe_dialog(self) -> None:
        w = self.window
        name = self.recipe_path.name if self.recipe_path else "ram-recipe.yaml"
        start = str(Path(self.save_folder()) / name)
        path, _ = QFileDialog.getSaveFileName(w, "Save recipe", start, "RAM recipes (*.yaml *.yml)")
        if path:
            self.save_recipe(Path(path))

    def export_charts_dialog(self) -> None:
        w = self.window
        if w.report is None:
            w.show_error("run the analysis first: there are no charts to export yet")
            return
        folder = QFileDialog.getExistingDirectory(w, "Export charts into", self.save_folder())
        if folder:
            names = w.export_charts(Path(folder))
            log.info("charts saved into %s: %s", folder, ", ".join(names))
            w.statusBar().showMessage(f"Saved {len(names)} charts into {folder}", 8000)
