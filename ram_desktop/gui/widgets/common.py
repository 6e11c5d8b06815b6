"""Small pieces the main window is built from: the message bar, a titled section, a splitter, a scroll area,
the tabs of the steps, a free folder name."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from PySide6.QtCore import QEvent, QObject, QSize, Qt
from PySide6.QtGui import QGuiApplication, QPainter, QWheelEvent
from PySide6.QtWidgets import (
    QAbstractButton,
    QAbstractItemView,
    QAbstractScrollArea,
    QAbstractSlider,
    QAbstractSpinBox,
    QApplication,
    QComboBox,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QScrollBar,
    QSizePolicy,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)


class ElidedLabel(QLabel):
    """One line of text that ends in … where the label is narrower than the text (it never runs past the
    panel's edge); the whole text is its tooltip."""

    def setText(self, text: str) -> None:
        super().setText(text)
        self.setToolTip(text if text else "")

    def displayed(self) -> str:
        """The text as painted now."""
        return self.fontMetrics().elidedText(self.text(), Qt.TextElideMode.ElideRight, self.contentsRect().width())

    def paintEvent(self, event) -> None:
        painter = QPainter(self)
        painter.setPen(self.palette().color(self.foregroundRole()))
        painter.drawText(
            self.contentsRect(), Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, self.displayed()
        )
        painter.end()


class CappedLabel(QLabel):
    """A wrapped label that shows the first line of its text, at most ``SHORT`` characters (then " …");
    ``text()`` is the whole text, ``displayed()`` what is shown, ``capped()`` whether they differ."""

    SHORT = 220

    def __init__(self) -> None:
        super().__init__()
        self._whole = ""
        self.setWordWrap(True)

    def setText(self, text: str) -> None:
        self._whole = text
        first = text.splitlines()[0] if text else ""
        super().setText(first[: self.SHORT].rstrip() + " …" if self.capped() else text)

    def text(self) -> str:
        return self._whole

    def displayed(self) -> str:
        return super().text()

    def capped(self) -> bool:
        first = self._whole.splitlines()[0] if self._whole else ""
        return first != self._whole or len(first) > self.SHORT


class MessageBar(QWidget):
    """A dismissible line at the top of the window for errors, warnings and notes (never modal). A long message
    (several lines, a list of tensor names) shows its first line; **Details…** unfolds the whole text, so a
    banner never pushes the window taller than the screen."""

    STYLES: ClassVar[dict[str, tuple[str, str]]] = {
        "error": ("#fdecea", "#b3261e"),
        "warning": ("#fff4ce", "#7a5a00"),
        "info": ("#e8f1fb", "#1a4d80"),
    }

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(10, 6, 6, 6)
        outer.setSpacing(4)
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        self.text = CappedLabel()
        self.text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        close = QPushButton("✕")
        close.setFlat(True)
        close.setFixedWidth(28)
        close.setToolTip("Dismiss")
        close.setAccessibleName("Dismiss the message")
        close.clicked.connect(self.hide)
        self.details_button = QPushButton("Details…")
        self.details_button.setCheckable(True)
        self.details_button.setToolTip("Show the whole message")
        self.details_button.toggled.connect(self._show_details)
        self.details_button.hide()
        self.details = QPlainTextEdit()
        self.details.setReadOnly(True)
        self.details.setMaximumHeight(110)
        self.details.hide()
        self.action_button = QPushButton()
        self.action_button.hide()
        self.action_button.clicked.connect(self._act)
        self._action: Callable[[], None] | None = None
        row.addWidget(self.text, 1)
        row.addWidget(self.details_button, 0, Qt.AlignmentFlag.AlignTop)
        row.addWidget(self.action_button, 0, Qt.AlignmentFlag.AlignTop)
        row.addWidget(close, 0, Qt.AlignmentFlag.AlignTop)
        outer.addLayout(row)
        outer.addWidget(self.details)
        self.kind = ""
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        self.hide()

    def show_message(self, kind: str, text: str, fix: tuple[str, Callable[[], None]] | None = None) -> None:
        """``text`` as an error, warning or info; ``fix``: a button's label and what it does (see :meth:`offer`)."""
        bg, fg = self.STYLES[kind]
        self.kind = kind
        self.setStyleSheet(
            f"MessageBar {{ background: {bg}; border: 1px solid {fg}; border-radius: 4px; }} QLabel {{ color: {fg}; }}"
        )
        prefix = {"error": "Error: ", "warning": "Warning: ", "info": ""}[kind]
        if text.lower().startswith(prefix.lower()) and prefix:  # "Error: Error: …" once only
            text = text[len(prefix) :]
        self.text.setText(prefix + text)
        self.details.setPlainText(prefix + text)
        self.details_button.setChecked(False)
        self.details_button.setVisible(self.text.capped())
        self._action = None
        self.action_button.hide()
        if fix is not None:
            self.offer(*fix)
        self.show()

    def _show_details(self, shown: bool) -> None:
        self.details.setVisible(shown)
        self.details_button.setText("Hide details" if shown else "Details…")

    def offer(self, label: str, action: Callable[[], None]) -> None:
        """A button beside the message shown: ``action`` runs when clicked, then the bar closes."""
        self._action = action
        self.action_button.setText(label)
        self.action_button.show()

    def _act(self) -> None:
        action, self._action = self._action, None
        self.hide()
        if action is not None:
            action()


def group(title: str, widget: QWidget) -> QGroupBox:
    """One numbered step of the window: ``widget`` in a box with a bold title."""
    box = QGroupBox(title)
    box.setStyleSheet("QGroupBox { font-weight: bold; } QGroupBox * { font-weight: normal; }")
    layout = QVBoxLayout(box)
    layout.setContentsMargins(8, 8, 8, 8)
    layout.addWidget(widget)
    return box


def splitter(orientation: Qt.Orientation, *parts: tuple[QWidget, int]) -> QSplitter:
    """A splitter of ``(widget, stretch factor)`` parts."""
    split = QSplitter(orientation)
    split.setChildrenCollapsible(False)  # a pane dragged small keeps its minimum, never vanishes
    for i, (widget, stretch) in enumerate(parts):
        split.addWidget(widget)
        split.setStretchFactor(i, stretch)
    return split


class WrappedLines(QLabel):
    """A wrapping label ``lines`` lines tall. A plain wrapping QLabel has a height-for-width, and a step's scroll
    area then grows the whole page to its preferred height: on a laptop screen the charts and tables below it
    were pushed out of view."""

    def __init__(self, text: str = "", lines: int = 2) -> None:
        super().__init__(text)
        self.setWordWrap(True)
        self.setMinimumHeight(lines * self.fontMetrics().lineSpacing() + 4)

    def hasHeightForWidth(self) -> bool:
        return False

    def sizeHint(self) -> QSize:  # its lines, not the tall hint of wrapped text at an arbitrary width
        return QSize(super().sizeHint().width(), self.minimumHeight())


def scrolled(widget: QWidget, keep_height: bool = False) -> QScrollArea:
    """``widget`` in a frameless scroll area that gives it all the room there is and scrolls when there is less
    than it needs, so its fields keep their heights instead of being crushed; ``keep_height``: never shorter
    than the widget needs (it scrolls sideways only)."""
    area = QScrollArea()
    area.setWidget(widget)
    area.setWidgetResizable(True)
    area.setFrameShape(QFrame.Shape.NoFrame)
    area.setFocusPolicy(Qt.FocusPolicy.NoFocus)  # the fields inside take focus, not the area
    if keep_height:
        area.setMinimumHeight(widget.minimumSizeHint().height() + area.horizontalScrollBar().sizeHint().height())
    return area


class StepTabs(QTabWidget):
    """The tabs of the window's large pane, each page in a scroll area (the window fits a small screen);
    ``setCurrentWidget``, ``currentWidget`` and ``indexOf`` speak of the pages themselves."""

    def add_page(self, page: QWidget, title: str) -> int:
        return self.addTab(scrolled(page), title)

    def shown_only_with(self, page: QWidget, widget: QWidget) -> None:
        """Show ``widget`` only while ``page`` is the current step (the window's Result box: Evaluate, Compare
        and Search need the height on a 1366×768 screen, and list the merged model themselves)."""
        self.currentChanged.connect(lambda _: widget.setVisible(self.currentWidget() is page))

    def indexOf(self, page: QWidget) -> int:
        for i in range(self.count()):
            area = super().widget(i)
            if area is page or (isinstance(area, QScrollArea) and area.widget() is page):
                return i
        return -1

    def widget(self, index: int) -> QWidget | None:
        area = super().widget(index)
        return area.widget() if isinstance(area, QScrollArea) else area

    def setCurrentWidget(self, page: QWidget) -> None:
        index = self.indexOf(page)
        if index >= 0:
            self.setCurrentIndex(index)

    def currentWidget(self) -> QWidget:
        page = self.widget(self.currentIndex())
        assert page is not None, "the steps have pages"
        return page


# a blue ring around the push button that has the keyboard focus (some platform styles draw none, or a dotted
# line that is hard to see); a style sheet, so that painting stays in Qt's C++ (a Python QStyle would run on
# every control painted, competing with a merge's threads for the interpreter). Only the focused state has a rule
# (an unfocused button keeps its platform look), so the button's size is the platform's, computed without the
# ring: the ring and its padding (6 px a side, 3 px above and below) stay within the platform's own margins, or
# the focused label is clipped ("\dd agent folder..", tests/gui/test_focus_ring.py).
FOCUS_RING = "QPushButton:focus { border: 2px solid #1a73e8; border-radius: 4px; padding: 1px 4px; }"


def keyboard_friendly(root: QWidget) -> None:
    """Under ``root``: the focus ring on push buttons, every table is one Tab stop (the arrow keys
    move inside it) and every button has an accessible name (:func:`name_buttons`)."""
    root.setStyleSheet(root.styleSheet() + FOCUS_RING)
    for view in root.findChildren(QAbstractItemView):
        view.setTabKeyNavigation(False)
    name_buttons(root)


def name_buttons(root: QWidget) -> None:
    """Every button under ``root`` without an accessible name gets one: its tooltip where its text is a symbol
    (…, ▲, ✕), else its text; a screen reader says what it does."""
    for button in root.findChildren(QAbstractButton):
        if button.accessibleName().strip():
            continue
        text = button.text().replace("&", "").strip()
        if not any(ch.isalpha() for ch in text):
            tip = QLabel(button.toolTip()).text() if button.toolTip() else ""
            text = re.sub(r"<[^>]+>", "", tip).strip() or text
        button.setAccessibleName(text)


class WindowTitle:
    """The window's title: one given for the sources shown (the demo, a recipe's name) until they change,
    then the agents and their base ("coder, tool on base"), or ``plain`` when there are none."""

    def __init__(self, window: QWidget, plain: str, sources: Any) -> None:
        self.window, self.plain, self.sources = window, plain, sources
        self._given_for: tuple | None = None

    def _key(self) -> tuple:
        base = self.sources.base
        return (base.spec if base else None, tuple(r.spec for r in self.sources.agents))

    def set(self, title: str) -> None:
        self.window.setWindowTitle(title)
        self._given_for = self._key()

    def follow(self) -> None:
        """The sources changed: a title given for others gives way to their names, for good (back at the given
        sources, e.g. a row added then removed, the title names what is there; it kept the removed row)."""
        if self._key() == self._given_for:
            return
        self._given_for = None
        base, names = self.sources.base, self.sources.names
        if base is None or not names:
            self.window.setWindowTitle(self.plain)
        else:
            self.window.setWindowTitle(f"{', '.join(names)} on {Path(base.spec.rstrip('/')).name}")


class WheelGuard(QObject):
    """The mouse wheel never changes a value the user is not editing: over a combo box, a spin box or a slider
    (in a form, a table cell, a dialog) that has no keyboard focus, the wheel scrolls the scroll area around it
    instead, as a page does in a browser. A field with the focus (clicked or tabbed into) still takes the wheel.

    The guard filters each top-level window's ``QWindow``, which receives a wheel before the widget under the
    pointer does, so a widget added later is covered without being told. It is never an application-wide
    filter: that runs Python for every event of every widget (a chart's first paint is some 1,600), and while
    a merge's threads hold the GIL each of those waits for it, which stalled the window for over 100 ms."""

    VALUE_WIDGETS = (QComboBox, QAbstractSpinBox, QAbstractSlider)

    def watch_windows(self, _focused: object = None) -> None:
        """Filter every top-level window there is (installing twice keeps one filter, Qt's rule)."""
        for window in QGuiApplication.topLevelWindows():
            window.installEventFilter(self)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() != QEvent.Type.Wheel or QApplication.activePopupWidget() is not None:
            return False
        assert isinstance(event, QWheelEvent)
        top = next((w for w in QApplication.topLevelWidgets() if w.windowHandle() == watched), None)
        under = top.childAt(event.position().toPoint()) if top is not None else None
        field = _value_widget(under) if under is not None else None
        if field is None or field.hasFocus():
            return False
        area = _scroll_area_around(field)
        if area is not None:
            bar = area.verticalScrollBar()
            if event.angleDelta().x() and not event.angleDelta().y():
                bar = area.horizontalScrollBar()
            QApplication.sendEvent(bar, event)
        return True  # the value stays


def _value_widget(widget: QWidget) -> QWidget | None:
    """``widget`` or the combo box, spin box or slider it is part of (a spin box's line edit), if any."""
    w: QWidget | None = widget
    while w is not None and not w.isWindow():
        if isinstance(w, QScrollBar):
            return None  # scroll bars are for the wheel
        if isinstance(w, WheelGuard.VALUE_WIDGETS):
            return w
        if isinstance(w, QAbstractScrollArea):
            return None  # a combo box's popup list, a table: they scroll themselves
        w = w.parentWidget()
    return None


def _scroll_area_around(widget: QWidget) -> QAbstractScrollArea | None:
    w = widget.parentWidget()
    while w is not None:
        if isinstance(w, QAbstractScrollArea):
            return w
        if w.isWindow():
            return None
        w = w.parentWidget()
    return None


_wheel_guard: WheelGuard | None = None


def guard_wheel() -> None:
    """Install the :class:`WheelGuard` (once; the window and ``setup_application`` call it): on the windows
    there are, and on every window there is whenever one takes the focus (a window or dialog shown later)."""
    global _wheel_guard
    app = QApplication.instance()
    if not isinstance(app, QApplication) or _wheel_guard is not None:
        return
    _wheel_guard = WheelGuard(app)
    _wheel_guard.watch_windows()
    app.focusWindowChanged.connect(_wheel_guard.watch_windows)


class StaleBanner(QWidget):
    """An amber line at the top of an area whose result is out of date: why, and the one action that refreshes
    it (``action`` emitted by its button). Hidden while the result is fresh."""

    def __init__(self, action: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("stale_banner")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        self.setStyleSheet(
            "#stale_banner { background: #fff4ce; border: 1px solid #c99a00; border-radius: 4px; }"
            " QLabel { color: #5c4400; }"
        )
        row = QHBoxLayout(self)
        row.setContentsMargins(8, 3, 4, 3)
        self.label = ElidedLabel()
        self.label.setMinimumWidth(60)  # a long reason ends in … (whole in its tooltip), never widens the area
        self.label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.button = QPushButton(action)
        self.button.setAccessibleName(action)
        row.addWidget(self.label, 1)
        row.addWidget(self.button)
        self.action = self.button.clicked
        self.hide()

    def set_stale(self, reason: str | None) -> None:
        """Show ``reason`` (None: the result is fresh, the banner goes)."""
        self.label.setText(f"Out of date: {reason}" if reason else "")
        self.setVisible(bool(reason))

    def text(self) -> str:
        return self.label.text()
