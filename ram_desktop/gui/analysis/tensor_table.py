"""The per-tensor table of a probe report: every tensor's layer, module, size and each agent's density,
sortable and filtered by name (the "Tensors" view of the analysis)."""

from __future__ import annotations

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, QSortFilterProxyModel, Qt
from PySide6.QtGui import QBrush
from PySide6.QtWidgets import QHBoxLayout, QHeaderView, QLabel, QLineEdit, QTableView, QVBoxLayout, QWidget

from ...core import ProbeReport
from ...core.engine.inspection import layer_of, module_kind
from .charts import agent_color, percent


def _role(role) -> int:
    return role if type(role) is int else int(role.value if hasattr(role, "value") else role)


_DISPLAY, _ALIGN, _TOOLTIP = (
    _role(r) for r in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.TextAlignmentRole, Qt.ItemDataRole.ToolTipRole)
)
_SORT = _role(Qt.ItemDataRole.UserRole) + 1
_ROOT = QModelIndex()  # the invisible root: a flat table's rows and columns hang under it
_ROLES = frozenset({_DISPLAY, _ALIGN, _TOOLTIP, _SORT})
_RIGHT = _role(Qt.AlignmentFlag.AlignRight) | _role(Qt.AlignmentFlag.AlignVCenter)
_FOREGROUND = _role(Qt.ItemDataRole.ForegroundRole)
_HEADER_ROLES = frozenset({_DISPLAY, _FOREGROUND, _TOOLTIP})


class TensorModel(QAbstractTableModel):
    """The per-tensor statistics as a table model: text for display, numbers for sorting (``SORT_ROLE``)."""

    SORT_ROLE = Qt.ItemDataRole.UserRole + 1

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.rows: list[tuple[list[str], list]] = []
        self.headers: list[str] = []
        self.agents = 0
        self.names: list[str] = []

    def set_report(self, report: ProbeReport | None) -> None:
        self.beginResetModel()
        self.rows, self.headers, self.agents, self.names = [], [], 0, []
        if report is not None:
            self.agents = len(report.agents)
            self.names = list(report.names)
            self.headers = ["Tensor", "Layer", "Module", "Elements"]
            for name in report.names:
                self.headers += [f"{name}\ndensity", f"{name}\nunique"]
            for stats in report.tensor_stats:
                layer = layer_of(stats.name)
                kind = module_kind(stats.name)
                texts = [
                    stats.name.removeprefix("model."),
                    str(layer) if layer is not None else "—",
                    kind,
                    f"{stats.params:,}",
                ]
                keys: list = [stats.name, layer if layer is not None else -1, kind, stats.params]
                for t in range(self.agents):
                    density = stats.updated[t] / stats.params if stats.params else None
                    share = stats.unique[t] / stats.updated[t] if stats.updated[t] else None
                    texts += [percent(density, 2), percent(share)]
                    keys += [-1.0 if density is None else density, -1.0 if share is None else share]
                self.rows.append((texts, keys))
        self.endResetModel()

    def rowCount(self, parent: QModelIndex | QPersistentModelIndex = _ROOT) -> int:
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent: QModelIndex | QPersistentModelIndex = _ROOT) -> int:
        return 0 if parent.isValid() else len(self.headers)

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        # roles compared as plain ints: comparing Qt's enum objects costs tens of microseconds per call,
        # and a table view asks for several roles per visible cell on every paint
        role = _role(role)
        if role not in _ROLES:
            return None
        row, col = index.row(), index.column()
        texts, keys = self.rows[row]
        if role == _DISPLAY:
            return texts[col]
        if role == _SORT:
            return keys[col]
        if role == _ALIGN:
            return _RIGHT if col >= 3 else None
        return keys[0] if col == 0 else None  # tooltip: the full tensor name

    def headerData(self, section, orientation, role=Qt.ItemDataRole.DisplayRole):
        role = _role(role)
        if role not in _HEADER_ROLES or orientation != Qt.Orientation.Horizontal:
            return None
        if role == _DISPLAY:
            return self.headers[section]
        if section < 4:
            return None
        if role == _FOREGROUND:
            return QBrush(agent_color(self.names[(section - 4) // 2]))
        return (
            "Share of the tensor's elements this agent updates"
            if section % 2 == 0
            else "Of this agent's updates in the tensor, the share no other agent touches"
        )


class TensorTable(QWidget):
    """Every merged tensor with its layer, module kind, size and, per agent, density and unique share;
    click a header to sort, type to filter by name. A model and a sort/filter proxy: nothing is built
    per cell, so thousands of tensors show at once."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        row = QHBoxLayout()
        self.filter = QLineEdit()
        self.filter.setPlaceholderText("Filter tensors by name, e.g. layers.3. or down_proj")
        self.filter.setClearButtonEnabled(True)
        row.addWidget(self.filter, 1)
        self.count = QLabel()
        row.addWidget(self.count)
        layout.addLayout(row)
        self.model = TensorModel(self)
        self.proxy = QSortFilterProxyModel(self)
        self.proxy.setSourceModel(self.model)
        self.proxy.setSortRole(TensorModel.SORT_ROLE)
        self.proxy.setFilterKeyColumn(0)
        self.proxy.setFilterCaseSensitivity(Qt.CaseSensitivity.CaseInsensitive)
        self.filter.textChanged.connect(self._apply_filter)
        self.table = QTableView()
        self.table.setModel(self.proxy)
        self.table.verticalHeader().setVisible(False)
        self.table.verticalHeader().setDefaultSectionSize(self.table.fontMetrics().lineSpacing() + 6)
        self.table.setSelectionBehavior(QTableView.SelectionBehavior.SelectRows)
        self.table.setAlternatingRowColors(True)
        self.table.setTextElideMode(Qt.TextElideMode.ElideMiddle)  # a name cut keeps its layer and its end
        self.table.setSortingEnabled(True)
        self.table.sortByColumn(-1, Qt.SortOrder.AscendingOrder)  # model order until a header is clicked
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        header.setStretchLastSection(False)
        layout.addWidget(self.table, 1)
        self.report: ProbeReport | None = None

    def show_report(self, report: ProbeReport | None) -> None:
        self.report = report
        self.model.set_report(report)
        if report is not None:  # the name column as wide as the longest name, up to 420 px (hover: the whole)
            widest = max((self.table.fontMetrics().horizontalAdvance(t.name) for t in report.tensor_stats), default=0)
            self.table.setColumnWidth(0, max(250, min(widest + 16, 420)))
            for col in range(1, self.model.columnCount()):
                self.table.setColumnWidth(col, 64 if col < 3 else 84)
        self._apply_filter(self.filter.text())

    def _apply_filter(self, text: str) -> None:
        self.proxy.setFilterFixedString(text.strip())
        self.count.setText(f"{self.proxy.rowCount()} of {self.model.rowCount()} tensors" if self.report else "")

    def column_values(self, column: int) -> list[str]:
        """The column as shown (sorted and filtered)."""
        return [self.proxy.data(self.proxy.index(r, column)) for r in range(self.proxy.rowCount())]


# --- which: UpSet-style intersections -----------------------------------------------------------------
