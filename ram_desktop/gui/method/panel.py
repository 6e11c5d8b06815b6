"""The method form, generated from the core's method registry (``METHODS``): a method added to the
registry appears here with its parameters, defaults, ranges and help without GUI changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QWidget,
)

from ...core import METHODS, OUT_DTYPES, VOCAB_MODES, MergeMethod, defaults, list_devices
from ..widgets.common import free_folder
from .fields import ParamField, PerAgentField

DTYPE_LABELS = {
    "base": "same as the base",
    "bfloat16": "bfloat16",
    "float16": "float16",
    "float32": "float32 (keeps RAM+ rescaling)",
}
VOCAB_LABELS = {
    "exact": "exact (refuse different vocabulary sizes)",
    "common": "common rows (merge the shared rows, keep the base's for the rest)",
}


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
            if m.stacks:  # layer stacking needs slices, which only a recipe or mergekit YAML gives (ram-merge run)
                continue
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
        self.eps.setToolTip(
            "Update threshold ε: an element counts as updated when |θ_agent − θ_base| > ε "
            "(default 1e-5). Changing it needs a new analysis."
        )
        self.device = QComboBox()
        self.device.addItem("Automatic (GPU when present)", "auto")
        for spec, label in list_devices():
            self.device.addItem(label, spec)
        self.device.setToolTip("Where the merge computes; the output is bit-identical on every device")
        self.out_dtype = QComboBox()
        for name in OUT_DTYPES:
            self.out_dtype.addItem(DTYPE_LABELS.get(name, name), name)
        self.out_dtype.setToolTip(
            "Dtype of the merged weights. RL updates are often one bf16 ulp: in bfloat16 "
            "most of RAM+'s rescaling rounds away; float32 keeps it"
        )
        self.vocab = QComboBox()
        self.vocab.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon
        )  # its long labels must
        self.vocab.setMinimumContentsLength(16)  # not set the width of the whole left pane
        for name in VOCAB_MODES:
            self.vocab.addItem(VOCAB_LABELS.get(name, name), name)
        self.vocab.setToolTip(
            "When an agent's embedding or output head has more or fewer vocabulary rows than the "
            "base's: exact refuses the merge; common merges the rows they share (only right when "
            "the agent's tokenizer extends the base's)"
        )
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
