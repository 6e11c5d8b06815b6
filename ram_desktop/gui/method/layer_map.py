"""A recipe's or mergekit file's layer map (``MergeSpec.slices``) in the method form, read-only: which output
layers read which model's layers, per slice, with the slice's own parameters. The map names its models by
position (0: the base, k: the k-th agent); the draft binds each to its agent's row key (``draft.BoundSlices``), so
the map follows its agents through reorder and rename, and a removed or added agent is a problem the form
states, with "Clear the layer map" as the fix."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QLabel,
    QPushButton,
    QSizePolicy,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from ..draft import BASE, BoundSlices

VISIBLE_ROWS = 6  # slices shown before the table scrolls (the method column must fit 1366×768)


def _layers(layer_range: Sequence[int]) -> str:
    start, stop = layer_range
    return f"{start}" if stop - start == 1 else f"{start}–{stop - 1}"


def _value(value: Any, name_of: Mapping[Any, str]) -> str:
    if isinstance(value, Mapping):
        return ", ".join(f"{name_of.get(k, k)} {_value(v, name_of)}" for k, v in value.items() if v is not None)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v, name_of) for v in value) + "]"
    return f"{value:g}" if isinstance(value, float) else str(value)


class LayerMapView(QWidget):
    """The layer map as a compact table (output layers, what they read, the slice's parameters), a line saying
    what the map decides in place of the form, and "Clear the layer map" (``clear_requested``)."""

    clear_requested = Signal()
    COLUMNS = ("Output layers", "Reads", "Parameters")
    TIPS = ("The output's decoder layers, from 0", "Model: its layers read, in order", "The slice's own parameters")

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("layer_map")
        self.setAccessibleName("Layer map")
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)  # no room left over inside
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.caption = QLabel()
        self.caption.setWordWrap(True)
        self.caption.setStyleSheet("color: #555;")
        self.table = QTableWidget(0, len(self.COLUMNS))
        self.table.setObjectName("layer_map_table")
        self.table.setHorizontalHeaderLabels(self.COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.table.setTabKeyNavigation(False)  # one Tab stop; the arrow keys scroll a long map
        self.table.setWordWrap(False)
        self.table.setTextElideMode(Qt.TextElideMode.ElideRight)
        header = self.table.horizontalHeader()
        for col, tip in enumerate(self.TIPS):
            header.model().setHeaderData(col, Qt.Orientation.Horizontal, tip, Qt.ItemDataRole.ToolTipRole)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)  # which model: never cut
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)  # long parameters elide (whole on hover)
        self.clear_button = QPushButton("Clear the layer map")
        self.clear_button.setObjectName("layer_map_clear")
        self.clear_button.setToolTip("Merge whole models instead: every layer of the base and the agents")
        self.clear_button.clicked.connect(self.clear_requested)
        layout.addWidget(self.caption)
        layout.addWidget(self.table)
        layout.addWidget(self.clear_button, 0, Qt.AlignmentFlag.AlignLeft)

    def show_map(self, bound: BoundSlices, agents: Sequence[tuple[Any, str]], label: str) -> None:
        """Fill the table for ``bound`` read with ``agents`` (key, name); ``label``: the method's name."""
        name_of: dict[Any, str] = {BASE: "base", **{key: name for key, name in agents}}
        removed = {key: f"{name} (removed)" for key, name in bound.names.items() if key not in name_of}
        self.table.setRowCount(len(bound.slices))
        start = 0
        for row, s in enumerate(bound.slices):
            sources = s["sources"]
            length = sources[0]["layer_range"][1] - sources[0]["layer_range"][0]
            out = _layers([start, start + length])
            start += length
            names = [name_of.get(x["model"]) or removed.get(x["model"], "?") for x in sources]
            ranges = {tuple(x["layer_range"]) for x in sources}
            if len(ranges) == 1:
                reads = f"{', '.join(names)}: {_layers(sources[0]['layer_range'])}"
            else:
                reads = "; ".join(f"{n}: {_layers(x['layer_range'])}" for n, x in zip(names, sources))
            params = s.get("parameters") or {}
            said = "; ".join(f"{k}: {_value(v, name_of)}" for k, v in params.items()) or "—"
            for col, text in enumerate((out, reads, said)):
                item = QTableWidgetItem(text)
                item.setToolTip(text)
                self.table.setItem(row, col, item)
        kind = "stacked" if bound.stacking else f"merged slice by slice ({label})"
        self.caption.setText(
            f"{start} output layers, {kind}; from the file, read-only. The layer map sets the method, "
            "and a slice's parameters replace the form's for its layers."
        )
        t = self.table
        rows = min(max(len(bound.slices), 1), VISIBLE_ROWS)
        t.setFixedHeight(
            t.horizontalHeader().sizeHint().height()
            + rows * t.verticalHeader().defaultSectionSize()
            + 2 * t.frameWidth()
            + 4  # the red outline of a problem takes 2 px a side
        )
