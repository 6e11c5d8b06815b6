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
from ...core.storage.manifest import entry_matches, record_files
from ..jobs import JobController, JobState, Outcome
from .charts import export_png
from .panel import AnalysisPanel

log = logging.getLogger("ram_desktop")


class ChartSaver(QObject):
    """Renders charts on the GUI thread (a few ms each, one per event-loop turn) and has the window's
    job controller encode and write them (state ``SAVING_CHARTS``).

    A chart's first grab renders it anew for the new paint device (26-60 ms, more while a merge's threads
    compete for the CPU); later grabs reuse that (2-12 ms). So once an analysis's charts are drawn, while the
    window is idle, each overview chart is grabbed once and the picture dropped (``prerendered``): the grab a
    merge's save makes later, as the merge ends, then never stalls the window."""

    def __init__(self, analysis: AnalysisPanel, jobs: JobController) -> None:
        super().__init__(jobs)
        self.analysis, self.jobs = analysis, jobs
        self.pending: list[tuple[Path, QWidget]] = []
        self._images: list[tuple[Path, QImage]] = []
        self._saved: list[str] = []
        self._then: Callable[[list[str]], None] | None = None
        self._to_prerender: list[QWidget] = []
        self.prerendered: list[QWidget] = []
        # its own timer (not QTimer.singleShot): it dies with the saver, never grabbing a closed window's charts
        self._prerender_timer = QTimer(self)
        self._prerender_timer.setSingleShot(True)
        self._prerender_timer.timeout.connect(self._prerender_next)
        jobs.finished.connect(self._job_finished)
        analysis.drawn.connect(self._prerender)

    def views(self, every_view: bool = True) -> list[tuple[str, QWidget]]:
        """Each analysis view's name and the widget pictured: the overview only, or ``every_view``; none before
        an analysis."""
        a = self.analysis
        if a.report is None:
            return []
        return [
            (chart.name, chart.picture(getattr(a, chart.attr)))
            for chart in a.registry
            if every_view or chart.overview  # the overview is drawn ahead: saving it never stalls the window
        ]

    def targets(self, folder: Path, every_view: bool = True) -> list[tuple[Path, QWidget]]:
        """Where each analysis view (:meth:`views`) is saved."""
        return [(Path(folder) / f"{name}.png", widget) for name, widget in self.views(every_view)]

    def _prerender(self) -> None:
        self._to_prerender = [widget for _, widget in self.views(every_view=False)]
        self.prerendered = []
        self._prerender_timer.start(0)

    def _prerender_next(self) -> None:
        """One overview chart grabbed, the next on a later turn; never while a merge runs or charts are queued or
        saved (the analysis is held then), where the grab is what this avoids."""
        if not self._to_prerender or self.analysis.held:
            return
        widget = self._to_prerender.pop(0)
        if not self.analysis.draw_now(widget):  # drawn (it is, after ``drawn``): rendered once for grabs
            widget.grab()
            self.prerendered.append(widget)
        self._prerender_timer.start(0)

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
            # a chart saved into a merge's output is ours: recorded in its manifest (where the name was free
            # or still held what the manifest lists), so --overwrite may still replace the folder
            ours = [path for path, _ in images if entry_matches(path.parent, path.name)]
            saved = []
            for path, image in images:
                # PySide6's stub types format as bytes, but the binding takes a str and refuses bytes (6.11)
                if image.save(str(path), "PNG"):  # type: ignore[call-overload]
                    saved.append(path.name)
                else:
                    log.warning("could not save the chart %s", path)
            for folder in {path.parent for path in ours}:
                record_files(folder, [p.name for p in ours if p.parent == folder and p.name in saved])
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
