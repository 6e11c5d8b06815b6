"""The method form's field widgets, one per parameter kind of a method's schema: numbers with their
ranges, true/false, per-agent values (one row per agent), and mergekit-style settings (a gradient over the
layers with a small plot, or filters) typed as one line of YAML or edited as a table (``filters_dialog``)."""

from __future__ import annotations

from collections.abc import Mapping
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

from ...core import InputError, Param, ParameterError
from .filters_dialog import FiltersDialog, gradient_of, gradient_plot, parse_setting, setting_text, show_gradient

INT32 = (-(2**31), 2**31 - 1)


def in_window_words(error: ParameterError, who: str) -> str:
    """A parameter's refusal as the window says it, from its fields: ``who`` (the field's name, e.g. "weight of
    coder") and the reason, then what the field reads; a setting's shape: ``who``, where in it, and why."""
    if error.reason.startswith(("[", ":")):
        return f"{who}{error.reason}"
    return f"{who} {error.reason}; it reads {error.value!r}"


def problem_of(param: Param, value: Any, who: str) -> str | None:
    """Why ``value`` is not a valid ``param`` (in the window's words, naming ``who``); None when it is."""
    try:
        param.validate(value)
    except ParameterError as e:
        return in_window_words(e, who)
    except InputError as e:
        return str(e)
    return None


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
        self.plot, self.curve = gradient_plot(f"gradient_{param.name}", 110)
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

    def problems(self) -> list[tuple[QWidget, str]]:
        """The field's input that the merge would refuse, with why (in the window's words)."""
        if isinstance(self.widget, (QCheckBox, QComboBox, QSpinBox, QDoubleSpinBox)):
            return []  # these hold only valid values
        problem = problem_of(self.param, self.value(), self.param.name)
        target = self.widget.edit if isinstance(self.widget, SettingEdit) else self.widget
        return [(target, problem)] if problem else []

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
    Fisher merging's calibration suite of each agent. Values are kept by agent identity (``set_agents``: a key
    per agent that survives reorder and rename), so each follows its agent; a removed agent's row and value
    go. ``value()`` keys them by agent name, as a ``MergeSpec`` does."""

    changed = Signal()

    def __init__(self, param: Param, agents: list[tuple[Any, str]]) -> None:
        super().__init__()
        self.param = param
        self._values: dict[Any, str] = {}
        self._agents: list[tuple[Any, str]] = []
        self._grid = QGridLayout(self)
        self._grid.setContentsMargins(0, 0, 0, 0)
        self.edits: list[QLineEdit] = []
        self.filter_buttons: list[FiltersButton] = []  # one per row of a setting (number, gradient or filters)
        self.set_agents(agents)

    def set_agents(self, agents: list[tuple[Any, str]]) -> None:
        """The agents in order, each as (key, name); values of keys no longer present are dropped."""
        self._agents = list(agents)
        keys = {key for key, _ in self._agents}
        self._values = {k: v for k, v in self._values.items() if k in keys}
        while self._grid.count():
            item = self._grid.takeAt(0)
            widget = item.widget() if item is not None else None
            if widget is not None:
                widget.deleteLater()
        self.edits = []
        self.filter_buttons = []
        for row, (key, name) in enumerate(self._agents):
            label = QLabel(name)
            edit = QLineEdit(self._values.get(key, ""))
            edit.setObjectName(f"param_{self.param.name}_{row}")
            edit.setToolTip(f"<b>{self.param.name}</b> of agent {name}: {self.param.describe()}")
            edit.textChanged.connect(lambda text, k=key: self._edited(k, text))
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

    def _edited(self, key: Any, text: str) -> None:
        self._values[key] = text
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

    def problems(self) -> list[tuple[QWidget, str]]:
        """Each agent's entry that the merge would refuse, with why, naming the agent (an empty row is the default)."""
        found: list[tuple[QWidget, str]] = []
        for edit, (_, name) in zip(self.edits, self._agents):
            text = edit.text().strip()
            if not text:
                continue
            value = parse_setting(text) if self.param.setting else text
            problem = problem_of(self.param, [value], f"{self.param.name} of {name}")
            if problem:
                found.append((edit, problem))
        return found

    def value(self) -> Any:
        """``{agent name: value}`` (a setting's empty row: None, its default); None when every row is empty (a
        setting: its default, one value for every agent)."""
        by_agent = self.by_agent()
        if by_agent is None:
            return self.param.default if self.param.setting else None
        return by_agent

    def by_agent(self) -> dict[str, Any] | None:
        """Each agent's value by agent name (a setting's empty row: None, its default; another parameter's
        empty row: left out); None when every row is empty."""
        texts = {name: self._values.get(key, "").strip() for key, name in self._agents}
        if not any(texts.values()):
            return None
        if self.param.setting:
            return {name: parse_setting(text) for name, text in texts.items()}
        return {name: text for name, text in texts.items() if text}

    def by_key(self) -> dict[Any, Any]:
        """Each filled row's value by agent key (a setting's: as ``parse_setting`` reads it; else the text)."""
        texts = {key: self._values.get(key, "").strip() for key, _ in self._agents}
        return {key: parse_setting(t) if self.param.setting else t for key, t in texts.items() if t}

    def set_by_key(self, values: Mapping[Any, Any]) -> None:
        """Each agent's value by agent key; an agent not given gets an empty row."""
        show = setting_text if self.param.setting else str
        self._values = {key: show(values[key]) for key, _ in self._agents if values.get(key) is not None}
        self.set_agents(self._agents)

    def set_value(self, value: Any) -> None:
        """A list in agent order, or one value for every agent (a setting's: a number, a gradient, filters);
        comma-separated text is a list."""
        show = setting_text if self.param.setting else str
        if self.param.setting and not isinstance(value, list):
            value = [value] * len(self._agents) if value is not None else []
        elif isinstance(value, str):
            value = value.split(",")
        items = list(value or [])
        self._values = {key: show(v) for (key, _), v in zip(self._agents, items) if v is not None}
        self.set_agents(self._agents)

    def set_by_agent(self, values: Mapping[str, Any]) -> None:
        """Each agent's value by agent name (a spec's agents' own); an agent not named gets an empty row."""
        show = setting_text if self.param.setting else str
        self._values = {key: show(values[name]) for key, name in self._agents if values.get(name) is not None}
        self.set_agents(self._agents)


class PerAgentField:
    """``ParamField``'s counterpart for a per-agent parameter."""

    def __init__(self, param: Param, agents: list[tuple[Any, str]]) -> None:
        self.param = param
        self.widget = PerAgentWidget(param, agents)
        self.widget.setObjectName(f"param_{param.name}")
        self.widget.setToolTip(f"<b>{param.name}</b>: {param.describe()}")
        self.changed = self.widget.changed

    def value(self) -> Any:
        return self.widget.value()

    def problems(self) -> list[tuple[QWidget, str]]:
        return self.widget.problems()

    def set_value(self, value: Any) -> None:
        self.widget.set_value(value)

    def by_agent(self) -> dict[str, Any] | None:
        return self.widget.by_agent()

    def set_by_agent(self, values: Mapping[str, Any]) -> None:
        self.widget.set_by_agent(values)

    def by_key(self) -> dict[Any, Any]:
        return self.widget.by_key()

    def set_by_key(self, values: Mapping[Any, Any]) -> None:
        self.widget.set_by_key(values)
