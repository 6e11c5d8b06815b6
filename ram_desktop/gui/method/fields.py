"""The method form's field widgets, one per parameter kind of a method's schema: numbers with their
ranges, true/false, per-agent values (one row per agent), and mergekit-style settings (a gradient over the
layers with a small plot, or filters) typed as one line of YAML or edited as a table (``filters_dialog``)."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QRegularExpression, Signal
from PySide6.QtGui import QRegularExpressionValidator
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from ...core import Param
from .filters_dialog import FiltersDialog, gradient_of, gradient_plot, parse_setting, setting_text, show_gradient

INT32 = (-(2**31), 2**31 - 1)


class PreciseSpinBox(QDoubleSpinBox):
    """A float spin box that keeps what the user or a recipe gave (12 decimals, so 0.1234 stays 0.1234 and
    is not rounded to 0.123) and shows it without trailing zeros."""

    DECIMALS = 12

    def __init__(self) -> None:
        super().__init__()
        self.setDecimals(self.DECIMALS)

    def textFromValue(self, value: float) -> str:
        text = f"{value:.{self.DECIMALS}f}".rstrip("0")
        return text + "0" if text.endswith(".") else text


SETTING_HINT = "a number, [0.2, 0.8] (a gradient over the layers) or [{filter: mlp, value: 0.5}, {value: 1}]"


class SettingEdit(QWidget):
    """A parameter whose value may be a gradient over the layers or filters by tensor name (``Param.setting``):
    a line of YAML flow text, a "Filters…" button that edits it as a table, and, for a gradient, a small plot
    of its values over the layers (position 0 = the first layer, 1 = the last; mergekit interpolates linearly
    between the listed values)."""

    changed = Signal()

    def __init__(self, param: Param, text: str = "") -> None:
        super().__init__()
        self.param = param
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.edit = QLineEdit(text)
        self.edit.setPlaceholderText(SETTING_HINT)
        self.edit.setObjectName(f"setting_{param.name}")
        self.edit.textChanged.connect(self._edited)
        self.filters = FiltersButton(param, self.edit, param.name)
        line = QHBoxLayout()
        line.addWidget(self.edit, 1)
        line.addWidget(self.filters)
        layout.addLayout(line)
        self.plot, self.curve = gradient_plot(f"gradient_{param.name}")
        layout.addWidget(self.plot)
        self._edited(text)

    def gradient(self) -> list[float] | None:
        """The typed value when it is a gradient (a list of numbers), else None."""
        return gradient_of(parse_setting(self.edit.text()))

    def _edited(self, _text: str = "") -> None:
        values = self.gradient()
        self.plot.setVisible(values is not None)
        if values is not None:
            show_gradient(self.curve, values)
        self.changed.emit()


class FiltersButton(QPushButton):
    """The "Filters…" button beside a setting's line edit: opens the filters table (``FiltersDialog``)
    pre-filled from the text; OK writes the setting back as that text, Cancel leaves it. ``dialog``: the one
    open, if any."""

    def __init__(self, param: Param, edit: QLineEdit, title: str, agent: int | None = None) -> None:
        super().__init__("Filters…")
        self.param, self.edit, self.title, self.agent = param, edit, title, agent
        self.dialog: FiltersDialog | None = None
        self.setObjectName(f"filters_{param.name}" + ("" if agent is None else f"_{agent}"))
        self.setToolTip(f"Edit {title} as a table: a value per tensor-name filter, gradients over the layers")
        self.clicked.connect(lambda _=False: self.open_editor())

    def open_editor(self) -> FiltersDialog:
        # a child of the button: a row rebuilt while it is open (the agents changed) takes its editor along
        dialog = FiltersDialog(self.param, parse_setting(self.edit.text()), self.agent, self.title, self)
        dialog.accepted.connect(lambda: self._write(dialog))
        dialog.finished.connect(lambda _=0: self._closed(dialog))
        self.dialog = dialog
        dialog.open()  # window-modal, without a nested event loop
        return dialog

    def _write(self, dialog: FiltersDialog) -> None:
        self.edit.setText(setting_text(dialog.setting()))
        self.edit.setCursorPosition(0)  # the start of a long line of filters, not its end

    def _closed(self, dialog: FiltersDialog) -> None:
        if self.dialog is dialog:
            self.dialog = None
        dialog.deleteLater()


def _fits_int32(param: Param) -> bool:
    low = param.minimum if param.minimum is not None else INT32[0]
    high = param.maximum if param.maximum is not None else INT32[1]
    return INT32[0] <= low and high <= INT32[1]


class ParamField:
    """One generated input for a ``Param``: spin box, combo box or line edit."""

    def __init__(self, param: Param) -> None:
        self.param = param
        tip = f"<b>{param.name}</b>: {param.describe()}"
        w: QWidget
        if param.setting:
            setting = SettingEdit(param, setting_text(param.default))
            w, self.changed = setting, setting.changed
        elif param.kind is bool:
            check = QCheckBox()
            check.setChecked(bool(param.default))
            w, self.changed = check, check.toggled
        elif param.choices:
            combo = QComboBox()
            combo.addItems(list(param.choices))
            combo.setCurrentText(str(param.default))
            w, self.changed = combo, combo.currentTextChanged
        elif param.kind is int and _fits_int32(param):
            spin = QSpinBox()
            spin.setRange(
                int(param.minimum) if param.minimum is not None else INT32[0],
                int(param.maximum) if param.maximum is not None else INT32[1],
            )
            spin.setValue(int(param.default))
            w, self.changed = spin, spin.valueChanged
        elif param.kind is int:  # wider than a QSpinBox (e.g. a 64-bit seed): digits, range checked by the core
            digits = QLineEdit(str(param.default))
            digits.setValidator(QRegularExpressionValidator(QRegularExpression(r"-?\d{0,20}")))
            w, self.changed = digits, digits.textChanged
        elif param.kind is float:
            number = PreciseSpinBox()
            number.setRange(
                param.minimum if param.minimum is not None else -1e12,
                param.maximum if param.maximum is not None else 1e12,
            )
            number.setSingleStep(0.01 if (param.maximum or 1e9) <= 10 else 0.1)
            number.setValue(float(param.default))
            number.setKeyboardTracking(True)
            w, self.changed = number, number.valueChanged
        else:
            text = QLineEdit(str(param.default))
            w, self.changed = text, text.textChanged
        w.setToolTip(tip)
        w.setObjectName(f"param_{param.name}")
        self.widget = w

    def value(self) -> Any:
        w = self.widget
        if isinstance(w, SettingEdit):
            value = parse_setting(w.edit.text())
            return self.param.default if value is None else value
        if isinstance(w, QCheckBox):
            return w.isChecked()
        if isinstance(w, QComboBox):
            return w.currentText()
        if isinstance(w, (QSpinBox, QDoubleSpinBox)):
            return w.value()
        assert isinstance(w, QLineEdit), type(w)  # the only other widget ParamField makes
        text = w.text().strip()
        if not text:
            return self.param.default
        try:
            return self.param.kind(text)
        except ValueError:
            return text  # the core's validation names the parameter and what it needs

    def set_value(self, value: Any) -> None:
        w = self.widget
        if isinstance(w, SettingEdit):
            w.edit.setText(setting_text(value))
        elif isinstance(w, QCheckBox):
            w.setChecked(value is True or str(value).strip().lower() == "true")
        elif isinstance(w, QComboBox):
            w.setCurrentText(str(value))
        elif isinstance(w, QSpinBox):
            w.setValue(int(value))
        elif isinstance(w, QDoubleSpinBox):
            w.setValue(float(value))
        else:
            assert isinstance(w, QLineEdit), type(w)  # the only other widget ParamField makes
            w.setText(str(value))


class PerAgentWidget(QWidget):
    """One line edit (with a browse button) per agent for a per-agent parameter (``Param.per_agent``), e.g.
    Fisher merging's calibration suite of each agent. Values are kept by agent position, so they survive
    the agent list being filled in after a recipe set them."""

    changed = Signal()

    def __init__(self, param: Param, names: list[str]) -> None:
        super().__init__()
        self.param = param
        self._values: list[str] = []
        self._names: list[str] = []
        self._grid = QGridLayout(self)
        self._grid.setContentsMargins(0, 0, 0, 0)
        self.edits: list[QLineEdit] = []
        self.filter_buttons: list[FiltersButton] = []  # one per row of a setting (number, gradient or filters)
        self.set_names(names)

    def set_names(self, names: list[str]) -> None:
        self._names = list(names)
        while self._grid.count():
            item = self._grid.takeAt(0)
            widget = item.widget() if item is not None else None
            if widget is not None:
                widget.deleteLater()
        self.edits = []
        self.filter_buttons = []
        rows = max(len(self._names), len(self._values), 1)
        for row in range(rows):
            name = self._names[row] if row < len(self._names) else f"agent {row + 1}"
            label = QLabel(name)
            edit = QLineEdit(self._values[row] if row < len(self._values) else "")
            edit.setObjectName(f"param_{self.param.name}_{row}")
            edit.setToolTip(f"<b>{self.param.name}</b> of agent {name}: {self.param.describe()}")
            edit.textChanged.connect(lambda text, r=row: self._edited(r, text))
            self._grid.addWidget(label, row, 0)
            self._grid.addWidget(edit, row, 1)
            if self.param.setting:  # a number, a gradient or filters per agent: no file to browse for
                edit.setPlaceholderText(f"{setting_text(self.param.default) or 'default'} — {SETTING_HINT}")
                self.filter_buttons.append(FiltersButton(self.param, edit, f"{self.param.name} of {name}", row))
                self._grid.addWidget(self.filter_buttons[-1], row, 2)
            else:
                edit.setPlaceholderText("suite file or folder" if self.param.name == "suite" else "folder")
                browse = QPushButton("…")
                browse.setFixedWidth(32)
                browse.setToolTip(f"Choose the {self.param.name} of agent {name}")
                browse.clicked.connect(lambda _=False, r=row: self._browse(r))
                self._grid.addWidget(browse, row, 2)
            self.edits.append(edit)

    def _edited(self, row: int, text: str) -> None:
        while len(self._values) <= row:
            self._values.append("")
        self._values[row] = text
        self.changed.emit()

    def _browse(self, row: int) -> None:
        start = self.edits[row].text() or ""
        if self.param.name == "suite":
            path, _ = QFileDialog.getOpenFileName(
                self, "Calibration suite", start, "Suites (*.jsonl suite.yaml);;All files (*)"
            )
        else:
            path = QFileDialog.getExistingDirectory(self, self.param.name, start)
        if path:
            self.edits[row].setText(path)

    def value(self) -> list[Any] | None:
        values = [v.strip() for v in self._values]
        while values and not values[-1]:
            values.pop()
        if self.param.setting and not values:
            return self.param.default  # one value for every agent
        if self.param.setting:  # one setting per agent; an empty row takes the default
            values += [""] * (len(self._names) - len(values))
            return [parse_setting(v) for v in values]
        return values or None

    def set_value(self, value: Any) -> None:
        if self.param.setting:
            if not isinstance(value, list):  # one value for every agent
                value = [value] * max(len(self._names), 1) if value is not None else []
            self._values = [setting_text(v) for v in value]
        else:
            values = value.split(",") if isinstance(value, str) else list(value or [])
            self._values = [str(v) for v in values]
        self.set_names(self._names)


class PerAgentField:
    """``ParamField``'s counterpart for a per-agent parameter."""

    def __init__(self, param: Param, names: list[str]) -> None:
        self.param = param
        self.widget = PerAgentWidget(param, names)
        self.widget.setObjectName(f"param_{param.name}")
        self.widget.setToolTip(f"<b>{param.name}</b>: {param.describe()}")
        self.changed = self.widget.changed

    def value(self) -> list[str] | None:
        return self.widget.value()

    def set_value(self, value: Any) -> None:
        self.widget.set_value(value)
