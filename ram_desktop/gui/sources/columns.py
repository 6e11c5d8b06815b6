"""How the sources table shares its width: the small columns (role, size, tensors, dtype, status) take what
their text needs, so Status is always in view; the source takes the rest and is cut at the left, so the folder's
own name stays readable (the full path is in its tooltip); the name takes what it needs, giving way to the
folders' names down to a third of the room (a long name is cut in the middle, whole in its tooltip)."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QModelIndex, QObject, QPersistentModelIndex, Qt
from PySide6.QtWidgets import QHeaderView, QStyle, QStyledItemDelegate, QStyleOptionViewItem, QTableWidget


class ElideLeft(QStyledItemDelegate):
    """Draws a cell's text cut at its start ("…/checkpoints/coder"), whatever the view's elide mode."""

    def initStyleOption(self, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex) -> None:
        super().initStyleOption(option, index)
        option.textElideMode = Qt.TextElideMode.ElideLeft


class ColumnFitter(QObject):
    """Keeps ``table``'s columns within its width: ``fit()`` after the rows change; the table's resizes are
    followed on their own."""

    def __init__(self, table: QTableWidget, name: int, source: int) -> None:
        super().__init__(table)
        self.table, self.name, self.source = table, name, source
        header = table.horizontalHeader()
        for col in range(table.columnCount()):
            header.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(name, QHeaderView.ResizeMode.Interactive)
        header.setSectionResizeMode(source, QHeaderView.ResizeMode.Stretch)
        header.setStretchLastSection(False)
        self._delegate = ElideLeft(table)
        table.setItemDelegateForColumn(source, self._delegate)
        table.viewport().installEventFilter(self)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.Resize:
            self.fit()
        return False

    def fit(self) -> None:
        table, header = self.table, self.table.horizontalHeader()
        others = sum(
            max(table.sizeHintForColumn(c), header.sectionSizeHint(c))
            for c in range(table.columnCount())
            if c not in (self.name, self.source)
        )
        room = table.viewport().width() - others
        wanted = max(table.sizeHintForColumn(self.name), header.sectionSizeHint(self.name))
        width = min(wanted, max(room - self._folders_width(), room // 3))
        table.setColumnWidth(self.name, max(header.minimumSectionSize(), width))

    def _folders_width(self) -> int:
        """The width that shows every source's own folder or file name whole, after a "…/"."""
        table, widest = self.table, 0
        for row in range(table.rowCount()):
            item = table.item(row, self.source)
            if item is not None:
                own = item.text().replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
                widest = max(widest, table.fontMetrics().horizontalAdvance(f"…/{own}"))
        margin = 2 * (table.style().pixelMetric(QStyle.PixelMetric.PM_FocusFrameHMargin, None, table) + 1)
        return widest + margin + 2
