"""The sources table: base model first, then the agents. Headers are read in the background."""

from __future__ import annotations

import itertools
import logging
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from ...core import Agent, Checkpoint, ProgressEvent, human_bytes, open_checkpoint, weights_file_filter
from ..analysis.charts import model_color
from ..session import Session, SourceRow, SourcesState
from ..worker import Job
from .columns import ColumnFitter
from .hub_dialog import HubDialog
from .rows import Row, check_agents, default_name, merge_blocker, status_text, unchecked_reason

log = logging.getLogger("ram_desktop")

COLUMNS = ["Role", "Name", "Source", "Size", "Tensors", "Dtype", "Status"]
ROLE, NAME, SOURCE, SIZE, TENSORS, DTYPE, STATUS = range(len(COLUMNS))
OK_COLOR, ERROR_COLOR, BUSY_COLOR = QColor("#2a7d2a"), QColor("#b3261e"), QColor("#666666")


class SourcesPanel(QWidget):
    """Base + agents. Emits ``changed`` whenever the set, order or names change, ``error`` with a message
    when a source cannot be opened, and ``browse_dir_changed`` with the last folder used. With a ``session``,
    each change is written to it (``Session.set_sources``) before ``changed`` reaches anyone else."""

    changed = Signal()
    error = Signal(str)
    browse_dir_changed = Signal(str)

    def __init__(self, session: Session | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        if session is not None:
            self.changed.connect(lambda: session.set_sources(self.state))
        self.setAcceptDrops(True)
        self.base: Row | None = None
        self.agents: list[Row] = []
        self.browse_dir = str(Path.home())
        self._generation = 0
        self._pending: dict[int, Row] = {}
        self._jobs: dict[int, Job] = {}  # generation -> the job opening that row
        self.hub_token: str | None = None  # from the Hub dialog, for this session only
        self._reported: set[str] = set()  # the open errors reported by ``error``

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.hint = QLabel("Drop model folders or .safetensors files here — the first one becomes the base.")
        self.hint.setWordWrap(True)
        self.hint.setStyleSheet("color: #666;")
        layout.addWidget(self.hint)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(
            QAbstractItemView.EditTrigger.DoubleClicked
            | QAbstractItemView.EditTrigger.EditKeyPressed
            | QAbstractItemView.EditTrigger.SelectedClicked
        )
        self.table.setWordWrap(False)
        self.table.setTextElideMode(Qt.TextElideMode.ElideMiddle)  # a long name keeps its start and end
        self.columns = ColumnFitter(self.table, NAME, SOURCE)  # Status in view; a source cut at its left
        self.table.itemChanged.connect(self._item_changed)
        self.table.itemSelectionChanged.connect(self._update_buttons)
        self.table.setMinimumHeight(self._rows_height(4))  # the base and three agents stay in view
        layout.addWidget(self.table, 1)

        buttons = QHBoxLayout()
        self.base_button = QPushButton("Base…")
        self.base_button.setToolTip("Choose the base model folder (the model every agent was fine-tuned from)")
        self.add_folder_button = QPushButton("Add agent folder…")
        self.add_file_button = QPushButton("Add file…")
        self.add_file_button.setToolTip("Add a single .safetensors file as an agent (or as the base when none is set)")
        self.add_hub_button = QPushButton("Add from Hub…")
        self.remove_button = QPushButton("Remove")
        self.up_button = QPushButton("▲")
        self.up_button.setToolTip("Move the selected agent up")
        self.down_button = QPushButton("▼")
        self.down_button.setToolTip("Move the selected agent down")
        for b in (self.up_button, self.down_button):
            b.setFixedWidth(32)
        for b in (self.base_button, self.add_folder_button, self.add_file_button, self.add_hub_button):
            buttons.addWidget(b)
        buttons.addStretch(1)
        edit = QHBoxLayout()  # a row of its own: one row of seven buttons set the left pane's width
        for b in (self.remove_button, self.up_button, self.down_button):
            edit.addWidget(b)
        edit.addStretch(1)
        layout.addLayout(buttons)
        layout.addLayout(edit)
        self.base_button.clicked.connect(self._browse_base)
        self.add_folder_button.clicked.connect(self._browse_agent_folder)
        self.add_file_button.clicked.connect(self._browse_file)
        self.add_hub_button.clicked.connect(self._ask_hub)
        self.remove_button.clicked.connect(self.remove_selected)
        self.up_button.clicked.connect(lambda: self.move_selected(-1))
        self.down_button.clicked.connect(lambda: self.move_selected(1))
        self._refresh()

    def _rows_height(self, rows: int) -> int:
        """The table's height that shows its header and ``rows`` rows whole (and a sideways scroll bar)."""
        t = self.table
        return (
            t.horizontalHeader().sizeHint().height()
            + rows * t.verticalHeader().defaultSectionSize()
            + t.horizontalScrollBar().sizeHint().height()
            + 2 * t.frameWidth()
        )

    # --- model --------------------------------------------------------------------------------
    def reject(self, message: str) -> None:
        """An analysis or merge failed with ``message``: the opened sources it names (``display:``) are marked
        rejected instead of ready (until the next failure or another base)."""
        for row in [self.base, *self.agents]:
            if row is not None:
                ck = row.checkpoint
                # the engine names the source at fault as "<source>: …" or, for a shape, "… in <source> but …"
                named = ck is not None and (f"{ck.display}:" in message or f" in {ck.display} but " in message)
                row.rejected = message if named else None
        self._refresh()

    def set_base(self, spec: str) -> None:
        for row in self.agents:
            row.rejected = None
        self.base = self._open(Row(str(spec), "base"))
        self._check_agents()  # none is ready for a base not yet read: each shows "checking…"
        self._refresh()
        self.changed.emit()

    def add_agent(self, spec: str, name: str | None = None) -> None:
        taken = {r.name for r in self.agents}
        name = name or default_name(str(spec))
        unique, k = name, 2
        while unique in taken:
            unique, k = f"{name}-{k}", k + 1
        used = {r.slot for r in self.agents}
        slot = next(i for i in itertools.count() if i not in used)
        self.agents.append(self._open(Row(str(spec), unique, slot)))
        self._refresh()
        self.changed.emit()

    def add_source(self, spec: str) -> None:
        """The first source becomes the base, later ones agents."""
        if self.base is None:
            self.set_base(spec)
        else:
            self.add_agent(spec)

    def clear(self) -> None:
        self.base = None
        self.agents = []
        self._pending.clear()
        self._refresh()
        self.changed.emit()

    def remove_selected(self) -> None:
        row = self._selected()
        if row is None:
            return
        removed = self.base if row == 0 else self.agents[row - 1]
        job = self._jobs.get(removed.generation) if removed is not None else None
        if job is not None:
            job.cancel()
        if row == 0:
            self.base = None
            self._check_agents()
        else:
            del self.agents[row - 1]
        for other in [self.base, *self.agents]:
            if other is not None:
                other.rejected = None  # refused along with the row removed, perhaps: the next analysis tells
        self._refresh()
        self.changed.emit()

    def keep_only(self, names: list[str]) -> None:
        """Remove every agent not named in ``names`` (a method that merges fewer agents offers this)."""
        for removed in [r for r in self.agents if r.name not in names]:
            job = self._jobs.get(removed.generation)
            if job is not None:
                job.cancel()
        self.agents = [r for r in self.agents if r.name in names]
        self._refresh()
        self.changed.emit()

    def move_selected(self, step: int) -> None:
        row = self._selected()
        if row is None or row == 0:
            return
        i, j = row - 1, row - 1 + step
        if not 0 <= j < len(self.agents):
            return
        self.agents[i], self.agents[j] = self.agents[j], self.agents[i]
        self._refresh()
        self.table.selectRow(j + 1)
        self.changed.emit()

    @property
    def names(self) -> list[str]:
        return [r.name for r in self.agents]

    @property
    def state(self) -> SourcesState:
        """The rows as a value (the session's ``sources``)."""
        return SourcesState(
            self.base.spec if self.base else "",
            tuple(SourceRow(r.key, r.name, r.spec, r.slot) for r in self.agents),
            self.all_ready(),
        )

    @property
    def chosen(self) -> tuple[str, tuple[Agent, ...]]:
        """The base's source ("" while none is chosen) and the agents in order, named: what a spec takes."""
        return self.state.chosen

    @property
    def busy(self) -> bool:
        return bool(self._pending)

    def all_ready(self) -> bool:
        return self.base is not None and self.base.ready and bool(self.agents) and all(r.ready for r in self.agents)

    def not_ready(self, action: str) -> str | None:
        """Why ``action`` (Analyze, Merge, Search) cannot run with these rows, naming the row; None when it can.
        A row that does not fit the base, or that the analysis refused, blocks everything that merges (Merge,
        Search) until it is removed (Analyze may try it again)."""
        if not self.all_ready():
            return f"add a base and at least one agent that open without errors, then {action}"
        return None if action == "Analyze" else self.merge_blocker()

    def merge_blocker(self) -> str | None:
        """Why a merge cannot run with these opened rows, naming the row and the fix; None when nothing blocks it."""
        return merge_blocker(self.base, self.agents)

    def errors(self) -> list[str]:
        return [r.error for r in ([self.base] if self.base else []) + self.agents if r.error]

    def error_gone(self, text: str) -> bool:
        """``text`` (a message shown) tells of a source that could not be opened, or of an agent that did not
        fit the base, and no row holds that any more."""
        held = set(self.errors()) | {r.mismatch for r in self.agents if r.mismatch}
        return any(text.endswith(e) for e in self._reported - held)

    def _check_agents(self) -> None:
        """Check the opened agents against the base; the first newly found not to fit is said through ``error``."""
        found = check_agents(self.base, self.agents)
        if found is not None:
            i, row = found
            self._reported.add(str(row.mismatch))
            self.error.emit(f"agent {i + 1} ({row.name}) does not fit the base: {row.mismatch}")

    # --- background opening -------------------------------------------------------------------
    def _open(self, row: Row) -> Row:
        self._generation += 1
        row.generation = self._generation
        self._pending[row.generation] = row
        spec, token, generation = row.spec, self.hub_token, row.generation
        job = Job(lambda reporter: open_checkpoint(spec, reporter, token=token), self)
        job.succeeded.connect(lambda ckpt: self._opened(generation, ckpt))
        job.failed.connect(lambda message: self._failed(generation, message))
        job.crashed.connect(lambda message, details: self._failed(generation, f"cannot open {spec}: {message}"))
        job.cancelled.connect(lambda: self._failed(generation, f"{spec}: cancelled"))
        job.progress.connect(lambda event: self._progressed(generation, event))
        job.finished.connect(lambda: self._jobs.pop(generation, None))
        self._jobs[generation] = job
        job.start()
        return row

    def _progressed(self, generation: int, event: ProgressEvent) -> None:
        row = self._pending.get(generation)
        if row is not None and event.stage == "download":
            row.status = f"downloading {int(event.fraction * 100)}%"
            self._refresh()

    def _opened(self, generation: int, ckpt: Checkpoint) -> None:
        row = self._pending.pop(generation, None)
        if row is None:
            return
        row.checkpoint, row.error = ckpt, None
        self._check_agents()
        self._refresh()
        self.changed.emit()

    def _failed(self, generation: int, message: str) -> None:
        row = self._pending.pop(generation, None)
        if row is None:
            return
        row.checkpoint, row.error = None, message
        self._reported.add(message)
        log.error(message)
        if row is self.base:
            self._check_agents()
        self._refresh()
        self.changed.emit()
        self.error.emit(message)

    def wait_idle(self, ms: int = 10000) -> bool:
        """Wait until every source being opened is done (tests, closing the window)."""
        for job in list(self._jobs.values()):
            if not job.wait(ms):
                return False
        return True

    # --- view ---------------------------------------------------------------------------------
    def _rows(self) -> list[tuple[str, Row | None]]:
        return [("base", self.base)] + [("agent", r) for r in self.agents]

    def _refresh(self) -> None:
        selected = self._selected()
        self.table.blockSignals(True)
        rows = self._rows()
        self.table.setRowCount(len(rows))
        for i, (role, row) in enumerate(rows):
            values = [role.capitalize() if i == 0 else f"Agent {i}", "", "", "", "", "", ""]
            if row is None:
                values[SOURCE] = "(no base yet: click Base… or drop a folder)"
            else:
                values[NAME] = row.name if role == "agent" else "—"
                values[SOURCE] = row.spec
                ck = row.checkpoint
                if ck is not None:
                    values[SIZE] = human_bytes(ck.size_bytes)
                    values[TENSORS] = f"{len(ck.tensors):,}"
                    values[DTYPE] = ck.dtype
                    values[STATUS] = status_text(role, row, self.base)
                elif row.error:
                    values[STATUS] = "✗ error"
                else:
                    values[STATUS] = row.status
            for col, text in enumerate(values):
                item = QTableWidgetItem(text)
                flags = Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable
                if col == NAME and role == "agent" and row is not None:
                    flags |= Qt.ItemFlag.ItemIsEditable
                    item.setToolTip(f"{row.name}: double-click to rename (names appear in charts, report and card)")
                    item.setForeground(QBrush(model_color(row.slot)))
                    font = item.font()
                    font.setBold(True)
                    item.setFont(font)
                item.setFlags(flags)
                if col == SOURCE and row is not None:
                    item.setToolTip(row.checkpoint.display if row.checkpoint else row.spec)
                if col == STATUS and row is not None:
                    if row.error or row.rejected or row.mismatch:
                        item.setForeground(QBrush(ERROR_COLOR))
                        item.setToolTip(row.error or row.rejected or row.mismatch or "")  # one of them is set here
                    elif row.checkpoint and (role == "base" or row.checked):
                        item.setForeground(QBrush(OK_COLOR))
                    elif row.checkpoint:
                        item.setForeground(QBrush(BUSY_COLOR))
                        item.setToolTip(unchecked_reason(self.base))
                    else:
                        item.setForeground(QBrush(BUSY_COLOR))
                if row is None:
                    item.setForeground(QBrush(BUSY_COLOR))
                if col in (SIZE, TENSORS):
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                self.table.setItem(i, col, item)
        self.table.blockSignals(False)
        self.columns.fit()
        if selected is not None and selected < len(rows):
            self.table.selectRow(selected)
        self._update_buttons()

    def _selected(self) -> int | None:
        rows = self.table.selectionModel().selectedRows() if self.table.selectionModel() else []
        return rows[0].row() if rows else None

    def _update_buttons(self) -> None:
        row = self._selected()
        self.remove_button.setEnabled(row is not None and (row > 0 or self.base is not None))
        self.up_button.setEnabled(row is not None and row > 1)
        self.down_button.setEnabled(row is not None and 0 < row < len(self.agents))
        self.base_button.setText("Change base…" if self.base else "Base…")

    def _item_changed(self, item: QTableWidgetItem) -> None:
        if item.column() != NAME or item.row() == 0:
            return
        row = self.agents[item.row() - 1]
        text = item.text().strip()
        others = {r.name for r in self.agents if r is not row}
        if not text or text in others:
            self.error.emit(f"agent name {text!r} is empty or already used; names must be unique")
            self._refresh()
            return
        if text != row.name:
            row.name = text
            self._refresh()
            self.changed.emit()

    def setEnabled(self, enabled: bool) -> None:
        for b in (self.base_button, self.add_folder_button, self.add_file_button, self.add_hub_button):
            b.setEnabled(enabled)
        self.setAcceptDrops(enabled)
        self.table.setEditTriggers(
            QAbstractItemView.EditTrigger.DoubleClicked
            | QAbstractItemView.EditTrigger.EditKeyPressed
            | QAbstractItemView.EditTrigger.SelectedClicked
            if enabled
            else QAbstractItemView.EditTrigger.NoEditTriggers
        )
        if enabled:
            self._update_buttons()
        else:
            for b in (self.remove_button, self.up_button, self.down_button):
                b.setEnabled(False)

    # --- user actions -------------------------------------------------------------------------
    def _remember(self, path: str) -> None:
        folder = str(Path(path).parent)
        self.browse_dir = folder
        self.browse_dir_changed.emit(folder)

    def _browse_base(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Base model folder", self.browse_dir)
        if path:
            self._remember(path)
            self.set_base(path)

    def _browse_agent_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Agent checkpoint folder", self.browse_dir)
        if path:
            self._remember(path)
            self.add_source(path)

    def _browse_file(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Checkpoint files", self.browse_dir, weights_file_filter())
        for path in paths:
            self._remember(path)
            self.add_source(path)

    def _ask_hub(self) -> None:
        dialog = HubDialog(self)
        if dialog.exec() == QDialog.DialogCode.Accepted and dialog.spec():
            if dialog.token():
                self.hub_token = dialog.token()  # kept in memory only: never in settings, recipes or logs
            self.add_source(dialog.spec())

    def cancel_downloads(self) -> None:
        """Stop every source still being opened (a Hub download in progress stops at the next update)."""
        for job in self._jobs.values():
            job.cancel()

    def dragEnterEvent(self, event) -> None:
        if event.mimeData().hasUrls():
            event.acceptProposedAction()

    def dragMoveEvent(self, event) -> None:
        if event.mimeData().hasUrls():
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:
        paths = [u.toLocalFile() for u in event.mimeData().urls() if u.isLocalFile()]
        for path in paths:
            self.add_source(path)
        if paths:
            self._remember(paths[-1])
            event.acceptProposedAction()
