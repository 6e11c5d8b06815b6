"""The filters editor of a setting (docs/gui.md, "Method and output"): one table row per filter entry ("tensor
name contains", "value"), rows added, removed and moved, the gradient plot of the selected row, and the value
common tensor names would get. The value comes from the core's resolution (``setting_value``) and the check
from the parameter's own validation (``Param.validate``), so the window and ``ram-merge`` give the same
message. The dialog edits a value; the field writes it back as the YAML text it already reads."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor, QPalette
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QGridLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from ...core import InputError, Param, setting_value

# the names the live preview resolves: a 32-layer model with Llama-style names (layer positions 0, ~0.5, 1)
SAMPLE_LAYERS = 32
SAMPLE_NAMES = (
    "model.embed_tokens.weight",
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.0.mlp.down_proj.weight",
    "model.layers.15.self_attn.o_proj.weight",
    "model.layers.15.mlp.up_proj.weight",
    "model.layers.31.input_layernorm.weight",
    "model.layers.31.mlp.gate_proj.weight",
    "model.norm.weight",
    "lm_head.weight",
)
INVALID = QColor("#f8d0d0")
NO_MATCH = object()  # what the preview gets when no row matches a name


def gradient_plot(object_name: str, height: int = 70) -> tuple[Any, Any]:
    """A small plot of a gradient's values over the layer positions 0 (the first layer) to 1 (the last):
    the widget and its curve (``show_gradient`` fills it)."""
    import pyqtgraph as pg

    plot = pg.PlotWidget()
    plot.setObjectName(object_name)
    plot.setFixedHeight(height)
    plot.setMouseEnabled(False, False)
    plot.hideButtons()
    plot.setLabel("bottom", "layer position")
    plot.getPlotItem().setContentsMargins(0, 8, 8, 0)  # room for the top tick label and the last x label
    return plot, plot.plot([], [], symbol="o", symbolSize=5)


def gradient_of(value: Any) -> list[float] | None:
    """A value when it is a gradient (a list of two or more numbers), as floats; else None."""
    if (
        isinstance(value, list)
        and len(value) > 1
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    ):
        return [float(v) for v in value]
    return None


def show_gradient(curve: Any, values: list[float]) -> None:
    """Plot a gradient's values at their layer positions (mergekit interpolates linearly between them)."""
    curve.setData([i / (len(values) - 1) for i in range(len(values))], values)


def parse_setting(text: str) -> Any:
    """A setting or a value cell as typed: YAML flow text (a number, a gradient list or filters); the text itself
    when it is not YAML, so the core's validation names the parameter and what it needs; None when empty."""
    import yaml

    text = text.strip()
    if not text:
        return None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def setting_text(value: Any) -> str:
    """A setting or a value as the form and the table show it: numbers plainly, gradients and filters as one
    line of YAML flow text."""
    import yaml

    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, dict)):
        return yaml.safe_dump(value, default_flow_style=True, sort_keys=False).strip()
    return str(value)


def rows_of(value: Any) -> list[tuple[str, str]]:
    """The table's rows for a setting: filters → one row each; a number or a gradient (or anything else) →
    one fallback row holding it; nothing → one empty fallback row."""
    if isinstance(value, dict):
        value = [value]
    if isinstance(value, list) and value and all(isinstance(e, dict) for e in value):
        return [("" if e.get("filter") is None else str(e["filter"]), setting_text(e.get("value"))) for e in value]
    return [("", setting_text(value))]


def entry_of(filt: str, value: str) -> dict[str, Any]:
    """One row as a filters entry, ``{filter, value}``; an empty filter cell writes no ``filter``: the fallback."""
    if filt.strip():
        return {"filter": filt.strip(), "value": parse_setting(value)}
    return {"value": parse_setting(value)}


def setting_of(rows: list[tuple[str, str]]) -> Any:
    """The setting the rows say: one fallback row alone → its value (a number or a gradient), else filters
    (a list of ``entry_of`` each row)."""
    entries = [entry_of(filt, value) for filt, value in rows]
    if len(entries) == 1 and "filter" not in entries[0]:
        return entries[0]["value"]
    return entries


def is_fallback(filt: str) -> bool:
    return filt.strip() in ("", "*")


class FallbackHint(QStyledItemDelegate):
    """Shows an empty "tensor name contains" cell as a grey "(every other tensor)": what the row means."""

    def initStyleOption(self, option: QStyleOptionViewItem, index: Any) -> None:
        super().initStyleOption(option, index)
        if not str(index.data() or "").strip():
            option.text = "(every other tensor)"
            option.palette.setColor(QPalette.ColorRole.Text, QColor("#888"))


class FiltersDialog(QDialog):
    """Edit one setting of ``param`` (``agent``: the per-agent row it belongs to, None: the merge's shared
    value) as a table of filters; ``setting()`` is the result once accepted."""

    def __init__(
        self, param: Param, value: Any, agent: int | None = None, title: str = "", parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.param = param
        self.agent = agent
        self.setObjectName(f"filters_dialog_{param.name}")
        self.setWindowTitle(f"Filters of {title or param.name}")
        layout = QVBoxLayout(self)
        intro = QLabel(
            "Each tensor takes the value of the <b>first</b> row whose text is part of its name; a row with "
            "no text (or <tt>*</tt>) is the fallback for every other tensor. A value is a number or a "
            "gradient over the layers such as <tt>[0,&nbsp;0.5,&nbsp;1]</tt>."
        )
        intro.setWordWrap(True)
        layout.addWidget(intro)

        self.table = QTableWidget(0, 2)
        self.table.setObjectName("filters_table")
        self.table.setHorizontalHeaderLabels(["tensor name contains", "value"])
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        self.table.verticalHeader().setVisible(False)
        self.table.setItemDelegateForColumn(0, FallbackHint(self.table))
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setToolTip(
            "tensor name contains: text such as mlp, self_attn or lm_head (empty or * = every other tensor); "
            f"value: {param.describe()}"
        )
        buttons = QVBoxLayout()
        self.add_button = self._button("Add", "Add a filter row (above the fallback row)", self.add_row, buttons)
        self.remove_button = self._button("Remove", "Remove the selected row", self.remove_row, buttons)
        self.up_button = self._button("Move up", "Move the selected row up: it is tried earlier", self._up, buttons)
        self.down_button = self._button("Move down", "Move the selected row down", self._down, buttons)
        buttons.addStretch(1)
        grid = QGridLayout()
        grid.addWidget(self.table, 0, 0)
        grid.addLayout(buttons, 0, 1)
        layout.addLayout(grid, 1)

        self.plot_label = QLabel()
        self.plot_label.setStyleSheet("color: #555;")
        layout.addWidget(self.plot_label)
        self.plot, self.curve = gradient_plot("filters_gradient", 130)
        layout.addWidget(self.plot)
        self.preview = QLabel()
        self.preview.setObjectName("filters_preview")
        self.preview.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.preview)
        self.error = QLabel()
        self.error.setObjectName("filters_error")
        self.error.setWordWrap(True)
        self.error.setStyleSheet("color: #b00020;")
        layout.addWidget(self.error)
        self.box = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        self.box.accepted.connect(self.accept)
        self.box.rejected.connect(self.reject)
        layout.addWidget(self.box)
        self.ok_button = self.box.button(QDialogButtonBox.StandardButton.Ok)

        for filt, text in rows_of(value):
            self._insert(self.table.rowCount(), filt, text)
        self.table.itemChanged.connect(lambda _item: self._refresh())
        self.table.currentCellChanged.connect(lambda *_: self._refresh())
        self.table.setCurrentCell(0, 1)
        self.resize(640, 660)
        self._refresh()

    def _button(self, text: str, tip: str, slot: Any, layout: QVBoxLayout) -> QPushButton:
        button = QPushButton(text)
        button.setToolTip(tip)
        button.clicked.connect(lambda _=False: slot())
        layout.addWidget(button)
        return button

    # the rows

    def rows(self) -> list[tuple[str, str]]:
        return [(self._text(r, 0), self._text(r, 1)) for r in range(self.table.rowCount())]

    def _text(self, row: int, column: int) -> str:
        item = self.table.item(row, column)
        return item.text() if item is not None else ""

    def _insert(self, row: int, filt: str, value: str) -> None:
        blocked = self.table.blockSignals(True)
        self.table.insertRow(row)
        self.table.setItem(row, 0, QTableWidgetItem(filt))
        self.table.setItem(row, 1, QTableWidgetItem(value))
        self.table.blockSignals(blocked)

    def add_row(self) -> None:
        """A new empty row above the first fallback row (a row below it would never be reached), else last."""
        fallbacks = [r for r, (filt, _) in enumerate(self.rows()) if is_fallback(filt)]
        row = fallbacks[0] if fallbacks else self.table.rowCount()
        self._insert(row, "", "")
        self.table.setCurrentCell(row, 0)
        item = self.table.item(row, 0)
        if item is not None:
            self.table.editItem(item)  # the user types the filter text straight away
        self._refresh()

    def remove_row(self) -> None:
        row = self.table.currentRow()
        if row >= 0:
            self.table.removeRow(row)
            self.table.setCurrentCell(min(row, self.table.rowCount() - 1), 1)
            self._refresh()

    def _up(self) -> None:
        self._move(-1)

    def _down(self) -> None:
        self._move(1)

    def _move(self, step: int) -> None:
        row, column = self.table.currentRow(), max(self.table.currentColumn(), 0)
        if row < 0 or not 0 <= row + step < self.table.rowCount():
            return
        rows = self.rows()
        rows[row], rows[row + step] = rows[row + step], rows[row]
        blocked = self.table.blockSignals(True)
        for r in (row, row + step):
            for c in (0, 1):
                item = self.table.item(r, c)
                if item is not None:
                    item.setText(rows[r][c])
        self.table.blockSignals(blocked)
        self.table.setCurrentCell(row + step, column)
        self._refresh()

    # what the rows say

    def setting(self) -> Any:
        """The setting the table holds (a number, a gradient or filters), as the recipe writes it."""
        return setting_of(self.rows())

    def check(self, setting: Any) -> str | None:
        """The core's message for this setting of the parameter (None: valid); per agent as the agent's entry."""
        if setting is None:  # one empty row: the field left empty, the default
            return None
        value = setting if self.agent is None else [None] * self.agent + [setting]
        try:
            self.param.validate(value)
        except InputError as err:
            return str(err)
        return None

    def _refresh(self) -> None:
        rows = self.rows()
        message = self.check(self.setting())
        blocked = self.table.blockSignals(True)
        for r, (filt, text) in enumerate(rows):
            wrong = None if message is None else self.check([entry_of(filt, text)])
            item = self.table.item(r, 1)
            if item is not None:
                item.setBackground(QBrush(INVALID) if wrong else QBrush())
                item.setToolTip(wrong or "")
        self.table.blockSignals(blocked)
        self.ok_button.setEnabled(message is None)
        self.error.setText(message or "")
        self.error.setVisible(message is not None)
        self._show_selected(rows)
        self.preview.setText(self._preview(rows, message is None))
        self.remove_button.setEnabled(self.table.rowCount() > 0 and self.table.currentRow() >= 0)
        self.up_button.setEnabled(self.table.currentRow() > 0)
        self.down_button.setEnabled(0 <= self.table.currentRow() < self.table.rowCount() - 1)

    def _show_selected(self, rows: list[tuple[str, str]]) -> None:
        row = self.table.currentRow()
        value = parse_setting(rows[row][1]) if 0 <= row < len(rows) else None
        values = gradient_of(value)
        if values is None and isinstance(value, (int, float)) and not isinstance(value, bool):
            values = [float(value), float(value)]  # one value: the same at every layer
        self.curve.setData([], [])
        if values is None:
            self.plot_label.setText("Select a row with a number or a gradient to see its values over the layers")
            return
        show_gradient(self.curve, values)
        self.plot_label.setText(f"Row {row + 1} over the layers (0 = the first, 1 = the last):")

    def _preview(self, rows: list[tuple[str, str]], valid: bool) -> str:
        """What the sample tensor names get (the core resolves them; "?" while a row is invalid)."""
        setting = setting_of(rows)
        default = "no value: the merge stops" if self.param.default is None else f"{self.param.default} (default)"
        lines = []
        for name in SAMPLE_NAMES:
            value = setting_value(setting, name, SAMPLE_LAYERS, NO_MATCH) if valid else "?"
            shown = default if value is NO_MATCH else f"{value:.6g}" if isinstance(value, float) else str(value)
            lines.append(f"<tr><td><tt>{name}</tt></td><td>&nbsp;→&nbsp;{shown}</td></tr>")
        unreached = [r + 1 for r in range(len(rows)) if any(is_fallback(f) for f, _ in rows[:r])]
        note = (
            f"<p style='color:#8a5a00'>Row {', '.join(map(str, unreached))} is never reached: a fallback row "
            "above it matches every tensor.</p>"
            if unreached
            else ""
        )
        return f"In a {SAMPLE_LAYERS}-layer model these tensors would get:<table>{''.join(lines)}</table>{note}"
