"""The method form, generated from the core's method registry (``METHODS``): a method added to the
registry appears here with its parameters, defaults, ranges and help without GUI changes."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from ...core import METHODS, OUT_DTYPES, VOCAB_MODES, InputError, MergeMethod, defaults, list_devices
from ...core.storage.output import free_folder
from ..draft import BoundSlices
from ..session import Session, Topic
from .fields import ParamField, PerAgentField
from .layer_map import LayerMapView

DTYPE_LABELS = {
    "base": "same as the base",
    "bfloat16": "bfloat16",
    "float16": "float16",
    "float32": "float32",
}
RESCALE_DTYPE_LABELS = {"float32": "float32 (keeps the rescaling)"}  # a method that rescales (λ): RAM+, RAM+s
DTYPE_TIP = "Dtype of the merged weights"
RESCALE_DTYPE_TIP = (
    "Dtype of the merged weights. RL updates are often one bf16 ulp: in bfloat16 most of {label}'s rescaling "
    "rounds away; float32 keeps it"
)
# a parameter whose name alone would be mistaken for another field of the form
PARAM_LABELS = {"dtype": "Compute dtype"}  # the method's arithmetic, not the saved weights (Output dtype)
# the form's rows: method, summary, the problem line, the layer map (shown with one), then the method's parameters
LAYER_MAP_ROW = 3
PARAMS_ROW = 4
METHOD_TIP = "Merge method; hover an entry for what it does"
LAYER_MAP_TIP = "Set by the layer map (its slices were written for this method); Clear the layer map to choose another"
VOCAB_LABELS = {
    "exact": "exact (refuse different vocabulary sizes)",
    "common": "common rows (merge the shared rows, keep the base's for the rest)",
}
TOKENIZER_CHOICES = {  # the output's tokenizer (``core.tokenizer``): None copies the base's files
    None: "the base's files (copied)",
    "union": "union (every agent's tokens, as mergekit)",
    "base": "base (the base's tokens, as mergekit)",
}


def _agents(n: int, how: str) -> str:
    words = {1: "one agent", 2: "two agents"}
    return words.get(n, f"{how} {n} agents") if how == "exactly" else f"{how} {words.get(n, f'{n} agents')}"


class MethodPanel(QWidget):
    """Emits ``changed`` when the method, a parameter, ε or the output dtype changes (λ table and the
    RAM+ rounding warning follow instantly), ``edited`` when anything the session's draft holds may have
    (``spec_form.bind_draft`` writes the draft then). ``session``: the window's session model."""

    changed = Signal()
    edited = Signal()
    out_dir_changed = Signal(str)
    keep_agents = Signal(list)  # the agents to keep (the others removed), offered when a method merges fewer
    INVALID = "border: 2px solid #b3261e; border-radius: 3px;"

    def __init__(self, session: Session | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session = session if session is not None else Session()
        self.form = QFormLayout(self)
        self.form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        self.method = QComboBox()
        for name, m in METHODS.items():
            if not m.streaming.stacks:  # layer stacking needs a layer map: offered while a recipe gives one
                self._add_method(name)
        self.method.setToolTip(METHOD_TIP)
        self.summary = QLabel()
        self.summary.setWordWrap(True)
        self.summary.setStyleSheet("color: #555;")
        self.form.addRow("Method", self.method)
        self.form.addRow("", self.summary)
        # what the merge would refuse, said here as it is typed, the field outlined in red
        self.problem = QLabel()
        self.problem.setWordWrap(True)
        self.problem.setObjectName("method_problem")
        self.problem.setStyleSheet("color: #b3261e;")
        self.fix_button = QPushButton()
        self.fix_button.setObjectName("method_fix")
        self.fix_button.hide()
        self.fix_button.clicked.connect(self._fix)
        self._keep: list[str] = []
        self._fixes: dict[str, tuple[str, Callable[[], None]]] = {}  # problem -> (button text, what it does)
        self.problem_box = QWidget()
        problem_rows = QVBoxLayout(self.problem_box)
        problem_rows.setContentsMargins(0, 0, 0, 0)
        problem_rows.addWidget(self.problem)
        problem_rows.addWidget(self.fix_button, 0, Qt.AlignmentFlag.AlignLeft)
        # the line's room (two lines) is kept while there is no problem: a problem typed comes and goes without
        # moving the fields under it (the cursor's field stays where it is); no more than its text needs, so a
        # tall form's spare height goes below the fields, not into a gap under the method's description
        self.problem_box.setMinimumHeight(2 * self.problem.fontMetrics().lineSpacing())
        self.problem_box.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)
        self.problem.hide()
        self.form.addRow("", self.problem_box)
        self.layer_map: BoundSlices | None = None  # a recipe's slices, bound to the agents' rows
        self.layer_map_view = LayerMapView()
        self.layer_map_view.clear_requested.connect(self.clear_layer_map)
        self.form.addRow("Layer map", self.layer_map_view)
        self.form.setRowVisible(LAYER_MAP_ROW, False)
        self.fields: dict[str, ParamField | PerAgentField] = {}
        self._param_rows: list[QWidget] = []
        self._agents: list[tuple[Any, str]] = []  # (key, name) per agent: the sources panel's rows
        self._agent_defaults: dict[
            str, dict[str, str]
        ] = {}  # per-agent parameter -> value by agent (the demo's suites)

        self.eps = QLineEdit(repr(defaults.EPS))
        self.eps.setToolTip(
            "Update threshold ε: an element counts as updated when |θ_agent − θ_base| > ε "
            "(default 1e-5). Changing it needs a new analysis."
        )
        self.device = QComboBox()
        self.device.addItem("Automatic (the faster for this method)", "auto")
        for spec, label in list_devices():
            self.device.addItem(label, spec)
        self.device.setToolTip(
            "Where the merge computes. Automatic: the CPU where the method has a fused CPU kernel (it streams a "
            "merge faster than a GPU, which must first receive every chunk), else a GPU when present; the log says "
            "which ran and why. A GPU gives the CPU's bytes, or stays within the method's stated tolerance "
            "(docs/methods.md, “On a GPU”)"
        )
        self.out_dtype = QComboBox()
        for name in OUT_DTYPES:
            self.out_dtype.addItem(DTYPE_LABELS.get(name, name), name)
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
        self.tokenizer = QComboBox()
        self.tokenizer.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.tokenizer.setMinimumContentsLength(16)
        for source, label in TOKENIZER_CHOICES.items():
            self.tokenizer.addItem(label, source)
        self.tokenizer.setToolTip(
            "The merged model's tokenizer: the base's files as they are, or a vocabulary built as mergekit's "
            "tokenizer_source builds it (union adds the tokens agents added, e.g. tool-call tokens; each "
            "model's embedding and output rows follow); a recipe may name model:NAME, tokens and a chat template"
        )
        self._tokenizer_loaded: dict | None = None  # a recipe's whole tokenizer block, kept while its source is
        self.chat_template: str | None = None  # a recipe's chat template (no widget: kept as loaded)
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
        self.form.labelForField(self.out_dtype).setToolTip(
            "The dtype the merged weights are saved in (a method's Compute dtype is what it calculates in)"
        )
        self.form.addRow("Vocabulary", self.vocab)
        self.form.addRow("Tokenizer", self.tokenizer)
        self.form.addRow("Shard size", self.shard_size)
        self.form.addRow("Output folder", out_row)
        self._fixed_rows = self.form.rowCount()

        self.method.currentIndexChanged.connect(self._rebuild)
        self.method.currentIndexChanged.connect(self._follow_method)
        self._out_parent: Path | None = None
        self._proposed_out = ""  # the output folder last proposed (not typed): it follows the method
        self.changed.connect(self.check)
        self.changed.connect(self.edited)
        for combo in (self.device, self.vocab, self.tokenizer):
            combo.currentIndexChanged.connect(lambda _: self.edited.emit())
        for edit in (self.shard_size, self.out_dir):
            edit.textChanged.connect(lambda _: self.edited.emit())
        self.out_dtype.currentIndexChanged.connect(lambda _: self.changed.emit())
        self.eps.textChanged.connect(lambda _: self.changed.emit())
        index = self.method.findData(defaults.METHOD)
        self.method.setCurrentIndex(max(index, 0))
        self._rebuild()
        # per-agent values have a row per agent of the Sources step
        self.session.watch(Topic.SOURCES, lambda sources: self.set_agents(sources.identities))

    @property
    def current(self) -> MergeMethod:
        return METHODS[self.method.currentData()]

    def _add_method(self, name: str) -> None:
        m = METHODS[name]
        self.method.addItem(m.label, name)
        self.method.setItemData(self.method.count() - 1, m.summary, Qt.ItemDataRole.ToolTipRole)

    # --- the layer map (a recipe's slices) ----------------------------------------------------
    def set_layer_map(self, slices: Sequence[Mapping[str, Any]] | None, method: str) -> None:
        """Show a spec's layer map (None: whole models), bound to the agents shown now (the spec's, in its
        order); a stacking map's method (passthrough) is offered while the map is shown."""
        self.set_bound_layer_map(BoundSlices.bind(slices, method, self._agents) if slices else None)

    def set_bound_layer_map(self, bound: BoundSlices | None) -> None:
        """Show a layer map already bound to the agents' rows (None: whole models)."""
        self.layer_map = bound
        stacking = self.layer_map is not None and self.layer_map.stacking
        for name, m in METHODS.items():
            index = self.method.findData(name)
            if m.streaming.stacks and stacking and index < 0:
                self._add_method(name)
            elif m.streaming.stacks and not stacking and index >= 0:
                if self.method.currentIndex() == index:
                    self.method.setCurrentIndex(self.method.findData(defaults.METHOD))
                self.method.removeItem(index)
        self._follow_layer_map()
        self.check()
        self.edited.emit()

    def clear_layer_map(self) -> None:
        """Merge whole models again (the form's method and values as they are; passthrough gives way to the
        default method, since it only stacks layers)."""
        self.set_layer_map(None, self.current.name)
        self.changed.emit()

    def slices(self) -> list[dict[str, Any]] | None:
        """The layer map for the agents shown now (models by position, per-agent values by name); None without
        one. Raises ``InputError`` with the form's problem when the agents no longer fit the map."""
        if self.layer_map is None:
            return None
        problem = self._layer_map_problem()
        if problem is not None:
            raise InputError(problem)
        return self.layer_map.spec_slices(self._agents)

    def _layer_map_problem(self) -> str | None:
        text = self.layer_map.problem(self._agents) if self.layer_map is not None else None
        if text is not None:
            self._fixes[text] = ("Clear the layer map", self.clear_layer_map)
        return text

    def _follow_layer_map(self) -> None:
        """The view shows the map; the method and every parameter set in each slice are disabled, saying why."""
        bound = self.layer_map
        self.form.setRowVisible(LAYER_MAP_ROW, bound is not None)
        self.method.setEnabled(bound is None)
        self.method.setToolTip(METHOD_TIP if bound is None else LAYER_MAP_TIP)
        if bound is not None:
            self.layer_map_view.show_map(bound, self._agents, self.current.label)
        for name, field in self.fields.items():
            everywhere = bound is not None and bound.set_in(name) == len(bound.slices)
            widget, label = field.widget, self.findChild(QLabel, f"label_{name}")
            if widget.property("form_tip") is None:
                widget.setProperty("form_tip", widget.toolTip())
            widget.setEnabled(not everywhere)
            widget.setToolTip(
                f"Not used: every slice of the layer map sets its own {name}"
                if everywhere
                else widget.property("form_tip")
            )
            if label is not None:
                label.setText(PARAM_LABELS.get(name, field.param.title) + (" (per slice)" if everywhere else ""))

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
            self.form.removeRow(PARAMS_ROW)
        self._param_rows = []
        self.fields = {}
        method = self.current
        self.summary.setText(method.summary)
        labels = {**DTYPE_LABELS, **RESCALE_DTYPE_LABELS} if method.rescales else DTYPE_LABELS
        for i in range(self.out_dtype.count()):  # the dtype's note speaks of rescaling only for a method that does
            self.out_dtype.setItemText(i, labels.get(self.out_dtype.itemData(i), self.out_dtype.itemData(i)))
        self.out_dtype.setToolTip(RESCALE_DTYPE_TIP.format(label=method.label) if method.rescales else DTYPE_TIP)
        for i, p in enumerate(method.params):
            field = PerAgentField(p, self._agents) if p.per_agent else ParamField(p)
            if isinstance(field, PerAgentField) and self._agent_defaults.get(p.name):
                field.set_by_agent(self._agent_defaults[p.name])
            field.changed.connect(lambda *_: self.changed.emit())
            label = QLabel(PARAM_LABELS.get(p.name, p.title))
            label.setObjectName(f"label_{p.name}")
            label.setToolTip(field.widget.toolTip())
            self.form.insertRow(PARAMS_ROW + i, label, field.widget)
            self.fields[p.name] = field
            self._param_rows.append(field.widget)
        self._follow_layer_map()
        self.changed.emit()

    def set_agents(self, agents: list[tuple[Any, str]]) -> None:
        """The agents per-agent parameters have one row for, in order, each as (key, name): the key stays with
        its agent through reorder and rename, so its values follow it."""
        if agents == self._agents:
            return
        self._agents = list(agents)
        for field in self.fields.values():
            if isinstance(field, PerAgentField):
                field.widget.set_agents(self._agents)
        if self.layer_map is not None:
            self.layer_map = self.layer_map.follow(self._agents)
            self.layer_map_view.show_map(self.layer_map, self._agents, self.current.label)
        self.check()
        self.edited.emit()

    def set_agent_names(self, names: list[str]) -> None:
        """``set_agents`` with each agent keyed by its name (agents given by name only, as a recipe gives them)."""
        self.set_agents([(name, name) for name in names])

    def forget_agents(self) -> None:
        """Another set of agents follows: the demo's per-agent defaults and an earlier file's layer map go."""
        self.set_agent_defaults("suite", None)
        self.set_layer_map(None, self.current.name)

    def set_agent_defaults(self, name: str, values: dict[str, str] | None) -> None:
        """Default values of a per-agent parameter by agent name (e.g. the demo agents' suites as Fisher
        calibration data), shown whenever a method with that parameter is picked; None forgets them."""
        if values:
            self._agent_defaults[name] = dict(values)
        else:
            self._agent_defaults.pop(name, None)
        field = self.fields.get(name)
        if isinstance(field, PerAgentField) and (values or field.by_agent() is None):
            field.set_by_agent(values or {})
            self.edited.emit()

    def problems(self) -> list[tuple[QWidget, str]]:
        """What the merge would refuse in this form, each with the widget to correct, in the window's words:
        agents the layer map no longer fits, the number of agents the method merges, then each bad value (naming
        the agent for a per-agent one)."""
        self._fixes = {}
        found: list[tuple[QWidget, str]] = []
        map_problem = self._layer_map_problem()
        if map_problem is not None:
            found.append((self.layer_map_view.table, map_problem))
        low, high = self.current.agents
        n = len(self._agents)
        if n and (n < low or (high is not None and n > high)):
            found.append((self.method, self._count_problem(low, high, n)))
        for field in self.fields.values():
            found += field.problems()
        return found

    def _count_problem(self, low: int, high: int | None, n: int) -> str:
        label = self.current.label
        if high is not None and n > high:
            self._keep = [name for _, name in self._agents[:high]]
            kept = " and ".join(self._keep)
            with_base = " with the base" if high == 1 else ""
            text = f"{label} merges {_agents(high, 'exactly')}{with_base}, not {n}: keep {kept} only?"
            self._fixes[text] = (f"Keep {kept} only", self._keep_only)
            return text
        self._keep = []
        return f"{label} merges {_agents(low, 'at least')}, not {n}: add agents in section 1, or choose another method"

    def check(self) -> str | None:
        """Show the first problem under the method (with its fix, when there is one) and outline every field
        that has one; return that problem (None: the form is fine)."""
        found = self.problems()
        for widget in self.findChildren(QWidget):
            if widget.property("invalid"):
                widget.setProperty("invalid", False)
                widget.setStyleSheet("")
        for widget, _ in found:
            widget.setProperty("invalid", True)
            # a table's outline only, not its header's and cells' too
            widget.setStyleSheet(
                f"QTableWidget {{ {self.INVALID} }}" if widget is self.layer_map_view.table else self.INVALID
            )
        first = found[0][1] if found else None
        self.problem.setText(first or "")
        self.problem.setVisible(first is not None)
        fix = self._fixes.get(first) if first is not None else None
        self.fix_button.setText(fix[0] if fix else "")
        self.fix_button.setVisible(fix is not None)
        return first

    def refused(self, show: Callable[[str], None], offer: Callable[[str, Callable[[], None]], None]) -> bool:
        """Before Merge: the form's first problem, if any, shown through ``show`` (with its fix through
        ``offer``) and its field given the focus; False when there is none."""
        found = self.problems()
        if not found:
            return False
        widget, text = found[0]
        show(text)
        fix = self._fixes.get(text)
        if fix is not None:
            offer(*fix)
        widget.setFocus()
        return True

    def _fix(self) -> None:
        fix = self._fixes.get(self.problem.text())
        if fix is not None:
            fix[1]()

    def _keep_only(self) -> None:
        if self._keep:
            self.keep_agents.emit(list(self._keep))

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

    def offers_device(self, spec: str) -> bool:
        return self.device.findData(spec) >= 0

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

    def set_tokenizer(self, settings: Mapping[str, Any] | None, chat_template: str | None) -> None:
        """Show a recipe's tokenizer source (a ``model:NAME`` source gets its own entry) and keep the rest."""
        self._tokenizer_loaded = dict(settings) if settings else None
        self.chat_template = chat_template
        source = settings["source"] if settings else None
        index = self.tokenizer.findData(source)
        if index < 0:
            self.tokenizer.addItem(str(source), source)
            index = self.tokenizer.count() - 1
        self.tokenizer.setCurrentIndex(index)
        self.edited.emit()  # the chat template has no widget

    def tokenizer_settings(self) -> dict | None:
        """The chosen tokenizer block: a loaded recipe's whole block while its source is chosen."""
        source = self.tokenizer.currentData()
        if source is None:
            return None
        loaded = self._tokenizer_loaded
        return dict(loaded) if loaded and loaded["source"] == source else {"source": source}

    def _browse_out(self) -> None:
        start = self.out_dir.text() or ""
        path = QFileDialog.getExistingDirectory(self, "Output folder", start)
        if path:
            self.out_dir.setText(path)
            self.out_dir_changed.emit(path)
