"""The method form, generated from the core's method registry (``METHODS``): a method added to the
registry appears here with its parameters, defaults, ranges and help without GUI changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import QRegularExpression, Signal
from PySide6.QtGui import QRegularExpressionValidator
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QWidget,
)

from ..core import METHODS, OUT_DTYPES, VOCAB_MODES, MergeMethod, Param, defaults, list_devices
from .widgets import free_folder

DTYPE_LABELS = {"base": "same as the base", "bfloat16": "bfloat16", "float16": "float16",
                "float32": "float32 (keeps RAM+ rescaling)"}
VOCAB_LABELS = {"exact": "exact (refuse different vocabulary sizes)",
                "common": "common rows (merge the shared rows, keep the base's for the rest)"}
INT32 = (-2**31, 2**31 - 1)


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


def _fits_int32(param: Param) -> bool:
    low = param.minimum if param.minimum is not None else INT32[0]
    high = param.maximum if param.maximum is not None else INT32[1]
    return INT32[0] <= low and high <= INT32[1]


class ParamField:
    """One generated input for a ``Param``: spin box, combo box or line edit."""

    def __init__(self, param: Param) -> None:
        self.param = param
        tip = f"<b>{param.name}</b>: {param.describe()}"
        if param.choices:
            w = QComboBox()
            w.addItems(list(param.choices))
            w.setCurrentText(str(param.default))
            self.changed = w.currentTextChanged
        elif param.kind is int and _fits_int32(param):
            w = QSpinBox()
            w.setRange(int(param.minimum) if param.minimum is not None else INT32[0],
                       int(param.maximum) if param.maximum is not None else INT32[1])
            w.setValue(int(param.default))
            self.changed = w.valueChanged
        elif param.kind is int:  # wider than a QSpinBox (e.g. a 64-bit seed): digits, range checked by the core
            w = QLineEdit(str(param.default))
            w.setValidator(QRegularExpressionValidator(QRegularExpression(r"-?\d{0,20}")))
            self.changed = w.textChanged
        elif param.kind is float:
            w = PreciseSpinBox()
            w.setRange(param.minimum if param.minimum is not None else -1e12,
                       param.maximum if param.maximum is not None else 1e12)
            w.setSingleStep(0.01 if (param.maximum or 1e9) <= 10 else 0.1)
            w.setValue(float(param.default))
            w.setKeyboardTracking(True)
            self.changed = w.valueChanged
        else:
            w = QLineEdit(str(param.default))
            self.changed = w.textChanged
        w.setToolTip(tip)
        w.setObjectName(f"param_{param.name}")
        self.widget = w

    def value(self) -> Any:
        w = self.widget
        if isinstance(w, QComboBox):
            return w.currentText()
        if isinstance(w, (QSpinBox, QDoubleSpinBox)):
            return w.value()
        text = w.text().strip()
        if not text:
            return self.param.default
        try:
            return self.param.kind(text)
        except ValueError:
            return text  # the core's validation names the parameter and what it needs

    def set_value(self, value: Any) -> None:
        w = self.widget
        if isinstance(w, QComboBox):
            w.setCurrentText(str(value))
        elif isinstance(w, QSpinBox):
            w.setValue(int(value))
        elif isinstance(w, QDoubleSpinBox):
            w.setValue(float(value))
        else:
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
        self.set_names(names)

    def set_names(self, names: list[str]) -> None:
        self._names = list(names)
        while self._grid.count():
            item = self._grid.takeAt(0)
            if item.widget() is not None:
                item.widget().deleteLater()
        self.edits = []
        rows = max(len(self._names), len(self._values), 1)
        for row in range(rows):
            name = self._names[row] if row < len(self._names) else f"agent {row + 1}"
            label = QLabel(name)
            edit = QLineEdit(self._values[row] if row < len(self._values) else "")
            edit.setObjectName(f"param_{self.param.name}_{row}")
            edit.setPlaceholderText("suite file or folder" if self.param.name == "suite" else "folder")
            edit.setToolTip(f"<b>{self.param.name}</b> of agent {name}: {self.param.describe()}")
            edit.textChanged.connect(lambda text, r=row: self._edited(r, text))
            browse = QPushButton("…")
            browse.setFixedWidth(32)
            browse.setToolTip(f"Choose the {self.param.name} of agent {name}")
            browse.clicked.connect(lambda _=False, r=row: self._browse(r))
            self._grid.addWidget(label, row, 0)
            self._grid.addWidget(edit, row, 1)
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
            path, _ = QFileDialog.getOpenFileName(self, "Calibration suite", start,
                                                  "Suites (*.jsonl suite.yaml);;All files (*)")
        else:
            path = QFileDialog.getExistingDirectory(self, self.param.name, start)
        if path:
            self.edits[row].setText(path)

    def value(self) -> list[str] | None:
        values = [v.strip() for v in self._values]
        while values and not values[-1]:
            values.pop()
        return values or None

    def set_value(self, value: Any) -> None:
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


class MethodPanel(QWidget):
    """Emits ``changed`` when the method, a parameter, ε or the output dtype changes (λ table and the
    RAM+ rounding warning follow instantly)."""

    changed = Signal()
    out_dir_changed = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.form = QFormLayout(self)
        self.form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        self.method = QComboBox()
        for name, m in METHODS.items():
            self.method.addItem(m.label, name)
            self.method.setItemData(self.method.count() - 1, m.summary, 3)  # Qt.ToolTipRole
        self.method.setToolTip("Merge method; hover an entry for what it does")
        self.summary = QLabel()
        self.summary.setWordWrap(True)
        self.summary.setStyleSheet("color: #555;")
        self.form.addRow("Method", self.method)
        self.form.addRow("", self.summary)
        self.fields: dict[str, ParamField | PerAgentField] = {}
        self._param_rows: list[QWidget] = []
        self._agent_names: list[str] = []
        self._agent_defaults: dict[str, list[str]] = {}  # per-agent parameter -> default values (the demo's suites)

        self.eps = QLineEdit(repr(defaults.EPS))
        self.eps.setToolTip("Update threshold ε: an element counts as updated when |θ_agent − θ_base| > ε "
                            "(default 1e-5). Changing it needs a new analysis.")
        self.device = QComboBox()
        self.device.addItem("Automatic (GPU when present)", "auto")
        for spec, label in list_devices():
            self.device.addItem(label, spec)
        self.device.setToolTip("Where the merge computes; the output is bit-identical on every device")
        self.out_dtype = QComboBox()
        for name in OUT_DTYPES:
            self.out_dtype.addItem(DTYPE_LABELS.get(name, name), name)
        self.out_dtype.setToolTip("Dtype of the merged weights. RL updates are often one bf16 ulp: in bfloat16 "
                                  "most of RAM+'s rescaling rounds away; float32 keeps it")
        self.vocab = QComboBox()
        self.vocab.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)  # its long labels must
        self.vocab.setMinimumContentsLength(16)  # not set the width of the whole left pane
        for name in VOCAB_MODES:
            self.vocab.addItem(VOCAB_LABELS.get(name, name), name)
        self.vocab.setToolTip("When an agent's embedding or output head has more or fewer vocabulary rows than the "
                              "base's: exact refuses the merge; common merges the rows they share (only right when "
                              "the agent's tokenizer extends the base's)")
        self.shard_size = QLineEdit(defaults.SHARD_SIZE)
        self.shard_size.setToolTip("Largest output shard, like 5GB, 500MB or 2GiB")
        self.out_dir = QLineEdit()
        self.out_dir.setPlaceholderText("output folder (must not exist, or be empty)")
        self.out_dir.setToolTip("Where the merged model, model card, recipe, report and charts are written")
        browse = QPushButton("…")
        browse.setFixedWidth(32)
        browse.setToolTip("Choose the output folder")
        browse.clicked.connect(self._browse_out)
        out_row = QHBoxLayout()
        out_row.addWidget(self.out_dir, 1)
        out_row.addWidget(browse)
        self.form.addRow("Threshold ε", self.eps)
        self.form.addRow("Device", self.device)
        self.form.addRow("Output dtype", self.out_dtype)
        self.form.addRow("Vocabulary", self.vocab)
        self.form.addRow("Shard size", self.shard_size)
        self.form.addRow("Output folder", out_row)
        self._fixed_rows = self.form.rowCount()

        self.method.currentIndexChanged.connect(self._rebuild)
        self.method.currentIndexChanged.connect(self._follow_method)
        self._out_parent: Path | None = None
        self._proposed_out = ""  # the output folder last proposed (not typed): it follows the method
        self.out_dtype.currentIndexChanged.connect(lambda _: self.changed.emit())
        self.eps.textChanged.connect(lambda _: self.changed.emit())
        index = self.method.findData(defaults.METHOD)
        self.method.setCurrentIndex(max(index, 0))
        self._rebuild()

    @property
    def current(self) -> MergeMethod:
        return METHODS[self.method.currentData()]

    def default_out(self, parent: Path, replace: bool) -> None:
        """Propose a free ``parent/<method>-merged`` as the output folder where none is chosen yet (or always:
        ``replace``); until edited it follows the method, so one method never targets another's output."""
        if replace or not self.out_dir.text().strip():  # the parent of a folder chosen earlier stays
            self._out_parent = parent
            self._propose_out()

    def _propose_out(self) -> None:
        if self._out_parent is not None:
            self._proposed_out = str(free_folder(self._out_parent / f"{self.current.name}-merged"))
            self.out_dir.setText(self._proposed_out)

    def _follow_method(self) -> None:
        if self.out_dir.text() == self._proposed_out:
            self._propose_out()

    def _rebuild(self) -> None:
        for _ in self._param_rows:
            self.form.removeRow(2)
        self._param_rows = []
        self.fields = {}
        method = self.current
        self.summary.setText(method.summary)
        for i, p in enumerate(method.params):
            field = PerAgentField(p, self._agent_names) if p.per_agent else ParamField(p)
            if p.per_agent and self._agent_defaults.get(p.name):
                field.set_value(self._agent_defaults[p.name])
            field.changed.connect(lambda *_: self.changed.emit())
            label = QLabel(p.name)
            label.setToolTip(field.widget.toolTip())
            self.form.insertRow(2 + i, label, field.widget)
            self.fields[p.name] = field
            self._param_rows.append(field.widget)
        self.changed.emit()

    def set_agent_names(self, names: list[str]) -> None:
        """The agents per-agent parameters have one entry for (one row each, in agent order)."""
        if names == self._agent_names:
            return
        self._agent_names = list(names)
        for field in self.fields.values():
            if isinstance(field, PerAgentField):
                field.widget.set_names(self._agent_names)

    def set_agent_defaults(self, name: str, values: list[str] | None) -> None:
        """Default values of a per-agent parameter (e.g. the demo agents' suites as Fisher calibration
        data), shown whenever a method with that parameter is picked; None forgets them."""
        if values:
            self._agent_defaults[name] = list(values)
        else:
            self._agent_defaults.pop(name, None)
        field = self.fields.get(name)
        if isinstance(field, PerAgentField) and (values or field.value() is None):
            field.set_value(values or [])

    def params(self) -> dict[str, Any]:
        return {name: f.value() for name, f in self.fields.items()}

    def set_method(self, name: str, params: dict[str, Any] | None = None) -> None:
        index = self.method.findData(name)
        if index < 0:
            raise ValueError(name)
        self.method.setCurrentIndex(index)
        for key, value in (params or {}).items():
            if key in self.fields and value is not None:
                self.fields[key].set_value(value)

    def eps_value(self) -> float:
        return float(self.eps.text().strip())

    def set_device(self, spec: str) -> None:
        index = self.device.findData(spec)
        if index < 0:  # a recipe's device this machine does not have: keep it visible, let the core judge
            self.device.addItem(spec, spec)
            index = self.device.count() - 1
        self.device.setCurrentIndex(index)

    def set_out_dtype(self, name: str) -> None:
        index = self.out_dtype.findData(name)
        if index >= 0:
            self.out_dtype.setCurrentIndex(index)

    def set_vocab(self, mode: str) -> None:
        index = self.vocab.findData(mode)
        if index >= 0:
            self.vocab.setCurrentIndex(index)

    def _browse_out(self) -> None:
        start = self.out_dir.text() or ""
        path = QFileDialog.getExistingDirectory(self, "Output folder", start)
        if path:
            self.out_dir.setText(path)
            self.out_dir_changed.emit(path)
