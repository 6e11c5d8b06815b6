"""The analysis charts as PNG files: a merge's overview saved into its output folder without stalling
the window, or every view at once (File ▸ Export charts)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, QTimer
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QWidget

from ...core import Reporter
from ..jobs import JobController, JobState, Outcome
from .charts import export_png
from .panel import AnalysisPanel

log = logging.getLogger("ram_desktop")
VIEWS = ("density", "overlap", "layers", "heatmap", "tensors", "intersections", "pairs", "ulps", "would-keep")
OVERVIEW = {"density", "overlap", "layers"}  # drawn ahead, so saving them never stalls the window


class ChartSaver(QObject):
    """Renders charts on the GUI thread (a few ms each, one per event-loop turn) and has the window's
    job controller encode and write them (state ``SAVING_CHARTS``)."""

    def __init__(self, analysis: AnalysisPanel, jobs: JobController) -> None:
        super().__init__(jobs)
        self.analysis, self.jobs = analysis, jobs
        self.pending: list[tuple[Path, QWidget]] = []
        self._images: list[tuple[Path, QImage]] = []
        self._saved: list[str] = []
        self._then: Callable[[list[str]], None] | None = None
        jobs.finished.connect(self._job_finished)

    def targets(self, folder: Path, every_view: bool = True) -> list[tuple[Path, QWidget]]:
        """Where each analysis view is saved: the overview only, or ``every_view``; none before an analysis."""
        a = self.analysis
        if a.report is None:
            return []
        widgets = (
            a.density,
            a.overlap,
            a.layers.graphics,
            a.heatmap,
            a.tensors,
            a.intersections,
            a.pairs,
            a.ulps,
            a.would_keep,
        )
        return [
            (Path(folder) / f"{name}.png", widget)
            for name, widget in zip(VIEWS, widgets)
            if every_view or name in OVERVIEW
        ]

    def queue(self, folder: Path) -> None:
        """A merge's overview charts, to be saved into ``folder`` by :meth:`save`."""
        self.pending = self.targets(folder, every_view=False)
        self._saved = []

    def save(self, then: Callable[[list[str]], None]) -> None:
        """Save the queued charts, then call ``then(names saved)``."""
        if self.pending:
            path, widget = self.pending[0]
            if not self.analysis.draw_now(widget):  # drawn already: grabbed now (else drawn now, grabbed next turn)
                self.pending.pop(0)
                self._images.append((path, widget.grab().toImage()))
            QTimer.singleShot(0, lambda: self.save(then))
            return
        images, self._images = self._images, []

        def write(reporter: Reporter) -> list[str]:
            saved = []
            for path, image in images:
                # PySide6's stub types format as bytes, but the binding takes a str and refuses bytes (6.11)
                if image.save(str(path), "PNG"):  # type: ignore[call-overload]
                    saved.append(path.name)
                else:
                    log.warning("could not save the chart %s", path)
            return saved

        self._then = then
        if not self.jobs.start(JobState.SAVING_CHARTS, write, self._written):
            self._then = None
            then([])

    def _written(self, names: list[str]) -> None:
        self._saved = names

    def _job_finished(self, state: JobState, outcome: Outcome) -> None:
        if state is JobState.SAVING_CHARTS:
            then, self._then = self._then, None
            if then is not None:
                then(self._saved)

    def export(self, folder: Path) -> list[str]:
        """Save every analysis chart as a PNG file into ``folder`` now; return their names."""
        names = []
        for path, widget in self.targets(folder):
            self.analysis.draw_now(widget)  # a view still waiting in the drawing queue
            try:
                export_png(widget, path)
                names.append(path.name)
            except OSError as e:
                log.warning("could not save the chart %s: %s", path.name, e)
        return names
