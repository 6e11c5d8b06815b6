"""The Evaluate step's suites table: one ticked row per suite with its size, its scorer (editable in
place, checked when changed, never run here) and what that scorer is; a python scorer's file is named and
shown in amber, a bad scorer in red."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import QAbstractItemView, QComboBox, QHeaderView, QTableWidget, QTableWidgetItem, QWidget

from ...core import InputError
from ...evaluate import Suite

BUILTIN_SCORERS = ("exact", "contains", "number", "regex:")


class SuitesTable(QTableWidget):
    """The suites and their rows, kept in step: ``suites[row]`` is the suite shown in ``row``."""

    error = Signal(str)  # a scorer refused, for the message bar
    changed = Signal()  # a row added, removed or its scorer changed

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(0, 4, parent)
        self.suites: list[Suite] = []
        self.setHorizontalHeaderLabels(["Suite", "Examples", "Scorer", "Scored by"])
        vertical = self.verticalHeader()
        vertical.setVisible(False)
        self.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        header = self.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.Interactive)
        header.setStretchLastSection(True)
        self.setColumnWidth(2, 110)
        self.setToolTip(
            "Tick the suites to run. Scorer: exact, contains, number, regex:PATTERN or "
            "python:FILE.py:FUNCTION (a TRL reward function; it runs only when you "
            "click Evaluate)"
        )

    def add(self, suite: Suite) -> None:
        """A ticked row for ``suite`` (once per source), its scorer editable in place."""
        if any(s.source == suite.source for s in self.suites):
            return
        self.blockSignals(True)
        row = self.rowCount()
        self.insertRow(row)
        name = QTableWidgetItem(suite.name)
        name.setFlags(Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable | Qt.ItemFlag.ItemIsUserCheckable)
        name.setCheckState(Qt.CheckState.Checked)
        name.setToolTip(str(suite.source))
        count = QTableWidgetItem(f"{len(suite):,}")
        count.setFlags(Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable)
        count.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.setItem(row, 0, name)
        self.setItem(row, 1, count)
        combo = QComboBox()
        combo.setEditable(True)
        for spec in dict.fromkeys([suite.scorer, *BUILTIN_SCORERS]):
            combo.addItem(spec)
        combo.setCurrentText(suite.scorer)
        combo.setToolTip("exact · contains · number · regex:PATTERN · python:FILE.py:FUNCTION")
        line_edit = combo.lineEdit()
        assert line_edit is not None  # an editable combo box has one
        line_edit.editingFinished.connect(lambda c=combo: self._scorer_edited(c))
        combo.activated.connect(lambda _=0, c=combo: self._scorer_edited(c))
        self.setCellWidget(row, 2, combo)
        runs = QTableWidgetItem()
        runs.setFlags(Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable)
        self.setItem(row, 3, runs)
        self.suites.append(suite)
        self._describe_scorer(row)
        self.blockSignals(False)
        self.changed.emit()

    def _scorer_combo(self, row: int) -> QComboBox:
        """Suite ``row``'s scorer box (every suite row has one, set in ``add``)."""
        combo = self.cellWidget(row, 2)
        assert isinstance(combo, QComboBox)
        return combo

    def _suite_item(self, row: int, column: int) -> QTableWidgetItem:
        """Suite ``row``'s item in ``column`` 0 (name) or 3 (scorer text), set in ``add``."""
        item = self.item(row, column)
        assert item is not None
        return item

    def _scorer_edited(self, combo: QComboBox) -> None:
        row = next((r for r in range(self.rowCount()) if self.cellWidget(r, 2) is combo), -1)
        if row < 0:
            return
        self.set_scorer(row, combo.currentText())

    def set_scorer(self, row: int, spec: str) -> bool:
        """Score suite ``row`` with ``spec`` (checked, never run here); a bad spec is refused and shown."""
        suite = self.suites[row]
        combo = self._scorer_combo(row)
        if spec.strip() == suite.scorer:
            return True
        try:
            self.suites[row] = suite.with_scorer(spec)
        except InputError as e:
            self.error.emit(f"suite {suite.name!r}: {e}")
            combo.setCurrentText(suite.scorer)
            return False
        combo.setCurrentText(self.suites[row].scorer)
        self._describe_scorer(row)
        return True

    def _describe_scorer(self, row: int) -> None:
        suite, item, combo = self.suites[row], self._suite_item(row, 3), self._scorer_combo(row)
        need = max(combo.sizeHint().width(), combo.fontMetrics().horizontalAdvance(suite.scorer) + 48)
        self.setColumnWidth(2, max(self.columnWidth(2), need))  # the scorer never cut
        try:
            spec = suite.scorer_spec
            text = spec.describe()
            item.setForeground(QBrush(QColor("#8a5a00" if spec.kind == "python" else "#333333")))
            item.setToolTip(f"{spec.file} will run when you click Evaluate" if spec.kind == "python" else text)
        except InputError as e:
            text = str(e)
            item.setForeground(QBrush(QColor("#b3261e")))
            item.setToolTip(text)
        item.setText(text)

    def remove_selected(self) -> None:
        rows = sorted({i.row() for i in self.selectedIndexes()}, reverse=True)
        for row in rows:
            self.removeRow(row)
            del self.suites[row]
        self.changed.emit()

    def checked_suites(self) -> list[Suite]:
        return [s for r, s in enumerate(self.suites) if self._suite_item(r, 0).checkState() == Qt.CheckState.Checked]
