"""Step 5 of the window: the merged model, with buttons to open it, publish it and evaluate it."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, QUrl, Signal
from PySide6.QtWidgets import QDialog, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from ...core import MergeResult, get_method, human_bytes
from ..evaluate.run_bar import duration
from ..jobs import JobController, JobState, Outcome
from ..widgets.common import StaleBanner
from ..widgets.open_dialogs import open_folder, show_card


class ResultBox(QWidget):
    """What the last merge wrote; it follows the job controller's merges (started, stopped without an
    output). Signals: ``publish_requested``, ``evaluate_requested``."""

    publish_requested = Signal()
    evaluate_requested = Signal()

    def __init__(self, jobs: JobController, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.out: Path | None = None
        self.dialog: QDialog | None = None  # the card or folder dialog shown last
        jobs.state_changed.connect(lambda state: self.merging() if state is JobState.MERGING else None)
        jobs.finished.connect(self._finished)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.result_text = QLabel("No merge yet.")
        self.result_text.setWordWrap(True)
        self.result_text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.result_text.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        # room for the result from the start: showing it must not re-lay out (and re-render) the charts
        self.result_text.setFixedHeight(self.result_text.fontMetrics().lineSpacing() * 3 + 6)
        self.open_folder_button = QPushButton("Open output folder")
        self.open_card_button = QPushButton("Open model card")
        self.publish_button = QPushButton("Publish to Hub…")
        self.publish_button.setToolTip("Create a Hugging Face repository and upload the merged model with its card")
        self.evaluate_result_button = QPushButton("Evaluate it →")
        self.evaluate_result_button.setToolTip("Score the merged model, the base and the agents on suites (step 6)")
        self.evaluate_result_button.setEnabled(False)
        buttons = QHBoxLayout()
        for button in (
            self.open_folder_button,
            self.open_card_button,
            self.publish_button,
            self.evaluate_result_button,
        ):
            buttons.addWidget(button)
        buttons.addStretch(1)
        self.stale = StaleBanner("Merge")  # the merged model is of other sources or settings (the window says)
        layout.addWidget(self.stale)
        layout.addWidget(self.result_text)
        layout.addLayout(buttons)
        self._enable_output(False)
        self.publish_button.clicked.connect(self.publish_requested)
        self.evaluate_result_button.clicked.connect(self.evaluate_requested)
        self.open_folder_button.clicked.connect(self.open_output_folder)
        self.open_card_button.clicked.connect(self.open_model_card)

    def _enable_output(self, enabled: bool) -> None:
        has_card = enabled and self.out is not None and (self.out / "README.md").is_file()
        self.open_folder_button.setEnabled(enabled)
        self.open_card_button.setEnabled(has_card)
        self.publish_button.setEnabled(has_card)

    def merging(self) -> None:
        """A merge started: the previous output is no longer offered."""
        self.out = None
        self.result_text.setText("Merging…")
        self._enable_output(False)
        self.evaluate_result_button.setEnabled(False)

    def _finished(self, state: JobState, outcome: Outcome) -> None:
        """A merge that stopped without an output says so (its reason is in the message bar and the log)."""
        if state is JobState.MERGING and outcome is not Outcome.DONE:
            self.result_text.setText(
                "Merge cancelled; nothing was written."
                if outcome is Outcome.CANCELLED
                else "The merge stopped with an error (see the message at the top); nothing was written."
            )

    def show_result(self, result: MergeResult, charts: list[str]) -> None:
        self.out = Path(result.out)
        method: str = result.report["method"]  # every merge report names its method (docs/contracts.md)
        lam = ", ".join(f"{n} {v:.3f}" for n, v in zip(result.probe.names, result.lambdas))
        lam = f" · λ: {lam}" if get_method(method).analysis.lambdas is not None else ""  # only a rescaling method has λ
        self.result_text.setText(
            f'<b>Merged model:</b> <a href="{QUrl.fromLocalFile(str(result.out)).toString()}">{result.out}</a><br>'
            f"{human_bytes(result.bytes_written)} of weights in {duration(result.seconds)} · method {method}{lam}<br>"
            "Also there: model card (README.md), ram-recipe.yaml, merge-report.json"
            + (", charts (PNG)." if charts else ".")
        )
        self.result_text.setOpenExternalLinks(True)
        self._enable_output(True)
        self.evaluate_result_button.setEnabled(True)

    def open_output_folder(self) -> None:
        """The file manager on the folder; where the desktop has none, a dialog that says where it is."""
        if self.out is not None:
            self.dialog = open_folder(self.out, self) or self.dialog

    def open_model_card(self) -> None:
        """The card rendered inside the window (an external launcher may not exist)."""
        if self.out is not None:
            self.dialog = show_card(self.out / "README.md", self)
