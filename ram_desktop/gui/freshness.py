"""What a change made stale, shown where the user looks (docs/gui.md, "What a change makes stale"): a banner at
the top of each area with the action that refreshes it, and a line in the status bar. The Qt-free rules live in
``session.py``; this module only shows them and tells the session what the panels did."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtWidgets import QLabel, QStatusBar

from .analysis.panel import AnalysisPanel
from .draft import form_params
from .evaluate.compare_panel import ComparePanel
from .evaluate.panel import EvaluatePanel
from .run.result_box import ResultBox
from .run.run_box import RunBox
from .session import REFRESH, Change, Part, Session, Topic
from .sources.panel import SourcesPanel


class FreshnessView:
    """Shows the session's freshness in the panels and the status bar, and reports the method's settings (the
    session's draft) and the scoring runs to the session. ``busy``: whether a job runs."""

    def __init__(
        self,
        session: Session,
        panels: tuple[SourcesPanel, AnalysisPanel, RunBox, ResultBox, EvaluatePanel, ComparePanel],
        status_bar: QStatusBar,
        busy: Callable[[], bool],
    ) -> None:
        self.session = session
        self.sources, self.analysis, self.run_box, self.result_box, self.evaluate, self.compare = panels
        self._busy = busy
        self._method_key: tuple | None = None  # the method settings last seen: a change makes the merge stale
        self.status = QLabel()  # what is out of date, in the status line (every banner says it in place)
        self.status.setStyleSheet("color: #7a5a00; font-weight: bold;")
        self.status.hide()
        status_bar.addPermanentWidget(self.status)
        session.subscribe(self.show)
        self.compare.compare_finished.connect(lambda status: session.made(Part.COMPARE) if status == "done" else None)
        session.watch(Topic.SCORES, self._scored)

    def show(self, part: Part, reason: str | None) -> None:
        """A banner at the top of ``part``'s area with the action that refreshes it, and the status line."""
        if part is Part.ANALYSIS:
            ready = self.sources.all_ready()
            if reason and not ready:
                reason += "; Analyze again once every source has opened (remove or replace a row marked ✗ error)"
            self.analysis.set_stale(reason)
            self.analysis.stale.button.setEnabled(ready and not self._busy())
            if reason:
                self.run_box.show_state(0, "Analysis out of date", f"{reason} — Analyze again.")
        elif part is Part.RESULT:
            self.result_box.stale.set_stale(reason)
        elif part is Part.COMPARE:
            self.compare.stale.set_stale(reason)
        elif part is Part.SCORES:
            self.evaluate.stale.set_stale(reason)
        stale = self.session.stale_parts()
        self.status.setText(
            "Out of date: " + ", ".join(p.value for p in stale) + f" — {REFRESH[stale[0]]} again" if stale else ""
        )
        self.status.setVisible(bool(stale))

    def method_seen(self) -> None:
        """The method settings now shown are those of the result shown (after a merge, or before any analysis)."""
        self._method_key = self._method_settings()

    def method_changed(self) -> None:
        """A change of method or of its parameters makes the merge result and the comparison stale."""
        settings = self._method_settings()
        if settings != self._method_key:
            if self._method_key is not None:
                self.session.changed(Change.METHOD)
            self._method_key = settings

    def merged(self, out: Path) -> None:
        """A merge into ``out`` finished: its result is fresh; scores shown of a model it replaced are not."""
        scored = self.session.scores
        if scored is not None and _holds(scored, out):
            self.session.changed(Change.MERGE)
        self.method_seen()
        self.session.made(Part.RESULT)

    def _method_settings(self) -> tuple:
        d = self.session.draft
        return (
            d.method,
            repr(sorted(form_params(d, self.session.sources.identities).items())),
            d.out_dtype,
            d.vocab,
            (d.tokenizer or {}).get("source"),
        )

    def _scored(self, scored: Any) -> None:
        """An evaluation's scores are shown: the merged model's are fresh when it was among the models scored."""
        merged = self.session.result
        if merged is not None and scored is not None and _holds(scored, merged.out):
            self.session.made(Part.SCORES)


def _holds(scored: Any, out: Path) -> bool:
    """The scores ``scored`` include the model in folder ``out``."""
    return any(m.source == str(out) for m in scored.models)
