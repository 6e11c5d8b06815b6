"""The method form, generated from the core's method registry (``METHODS``): a method added to the
registry appears here with its parameters, defaults, ranges and help without GUI changes."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (QComboBox, QDoubleSpinBox, QFileDialog, QFormLayout, QHBoxLayout, QLabel, QLineEdit,
                               QPushButton, QSpinBox, QWidget)

from ..core.engine import list_devices
from ..core.methods import METHODS, MergeMethod, Param
from ..core.plan import OUT_DTYPES

DTYPE_LABELS = {"base": "same as the base", "bfloat16": "bfloat16", "float16": "float16",
                "float32": "float32 (keeps RAM+ rescaling)"}


def _decimals(p: Param) -> int:
    text = repr(float(p.default))
    if "e" in text:
        return 8
    return max(3, min(6, len(text.split(".")[1]) + 2))


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
        elif param.kind is int:
            w = QSpinBox()  # a 32-bit range; larger values (e.g. 64-bit seeds) come from recipes or the CLI
            low = int(param.minimum) if param.minimum is not None else -2**31
            high = int(param.maximum) if param.maximum is not None else 2**31 - 1
            w.setRange(max(low, -2**31), min(high, 2**31 - 1))
            w.setValue(int(param.default))
            self.changed = w.valueChanged
        elif param.kind is float:
            w = QDoubleSpinBox()
            w.setDecimals(_decimals(param))
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
        return self.param.kind(w.text()) if w.text().strip() else self.param.default

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


class MethodPanel(QWidget):
    """Emits ``changed`` when the method, a parameter, ε or the output dtype changes (λ table and the
    RAM+ rounding warning follow instantly)."""

    changed = Signal()
    out_dir_changed = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.form = QFormLayout(self)
        self.form.setFieldGrowthPolicy(QFormLayout.AllNonFixedFieldsGrow)
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
        self.fields: dict[str, ParamField] = {}
        self._param_rows: list[QWidget] = []

        self.eps = QLineEdit("1e-05")
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
        self.shard_size = QLineEdit("5GB")
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
        self.form.addRow("Shard size", self.shard_size)
        self.form.addRow("Output folder", out_row)
        self._fixed_rows = self.form.rowCount()

        self.method.currentIndexChanged.connect(self._rebuild)
        self.out_dtype.currentIndexChanged.connect(lambda _: self.changed.emit())
        self.eps.textChanged.connect(lambda _: self.changed.emit())
        index = self.method.findData("ram-plus")
        self.method.setCurrentIndex(index if index >= 0 else 0)
        self._rebuild()

    @property
    def current(self) -> MergeMethod:
        return METHODS[self.method.currentData()]

    def _rebuild(self) -> None:
        for _ in self._param_rows:
            self.form.removeRow(2)
        self._param_rows = []
        self.fields = {}
        method = self.current
        self.summary.setText(method.summary)
        for i, p in enumerate(method.params):
            field = ParamField(p)
            field.changed.connect(lambda *_: self.changed.emit())
            label = QLabel(p.name)
            label.setToolTip(field.widget.toolTip())
            self.form.insertRow(2 + i, label, field.widget)
            self.fields[p.name] = field
            self._param_rows.append(field.widget)
        self.changed.emit()

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

    def _browse_out(self) -> None:
        start = self.out_dir.text() or ""
        path = QFileDialog.getExistingDirectory(self, "Output folder", start)
        if path:
            self.out_dir.setText(path)
            self.out_dir_changed.emit(path)
