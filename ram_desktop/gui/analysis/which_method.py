"""Which method? The probe's advice (``core.methods.advice``) as a view of the Analysis step: the numbers that
decide between methods, what each implies in words, and the methods worth searching first."""

from __future__ import annotations

import html

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from ...core import ProbeReport, advise


class WhichMethodView(QWidget):
    """The advice on the shown report, read for a bfloat16 output (as the command line's probe does)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        self.text = QLabel()
        self.text.setObjectName("which_method")
        self.text.setWordWrap(True)
        self.text.setTextFormat(Qt.TextFormat.RichText)
        self.text.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.text)
        layout.addStretch(1)

    def show_report(self, report: ProbeReport | None) -> None:
        if report is None:
            self.text.setText("")
            return
        advice = advise(report, "bfloat16")
        rows = "".join(
            f"<tr><td>{html.escape(a.name)}</td><td align=right>{a.density:.1%}</td>"
            f"<td align=right>{'—' if a.unique_share is None else f'{a.unique_share:.0%}'}</td>"
            f"<td align=right>{'∞' if a.rho is None else f'{a.rho:.2f}'}</td><td align=right>×{a.lam:.3f}</td>"
            f"<td align=right>{'—' if a.rescale_survival is None else f'{a.rescale_survival:.0%}'}</td></tr>"
            for a in advice.agents
        )
        agreement = (
            ""
            if advice.sign_agreement is None
            else f"<p>Sign agreement on shared elements: {advice.sign_agreement:.0%}</p>"
        )
        findings = "".join(f"<li>{html.escape(f)}</li>" for f in advice.findings)
        self.text.setText(
            "<table cellspacing=6><tr><th align=left>agent</th><th>density</th><th>unique</th><th>ρ</th>"
            f"<th>RAM+ λ</th><th>rescale kept (bf16)</th></tr>{rows}</table>{agreement}<ul>{findings}</ul>"
            f"<p><b>Worth searching first:</b> {html.escape(', '.join(advice.methods))} "
            "(step 8 · Search tries them on your validation suites)</p>"
        )
