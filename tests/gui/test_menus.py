"""The window's menus: each action keeps its standard shortcut and calls what it names when triggered."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import QFileDialog, QMenu, QMessageBox


def _action(menu_bar, menu_title: str, text: str):
    menu = next(m for m in menu_bar.findChildren(QMenu) if m.title() == menu_title)
    return next(a for a in menu.actions() if a.text() == text)


def test_file_actions_have_their_standard_shortcuts(window):
    bar = window.menuBar()
    for text, key in (
        ("&Open recipe…", QKeySequence.StandardKey.Open),
        ("&Save recipe…", QKeySequence.StandardKey.Save),
        ("&Quit", QKeySequence.StandardKey.Quit),
    ):
        assert _action(bar, "&File", text).shortcut() == QKeySequence(key), text
    assert _action(bar, "&File", "&Export charts as PNG…").shortcut().isEmpty()


def test_open_recipe_action_asks_for_a_file(window, monkeypatch):
    asked = []
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: asked.append(a[1]) or ("", ""))
    window.menus.open_action.trigger()
    assert asked == ["Open recipe"]


def test_recent_recipe_action_opens_that_recipe(window, tmp_path, monkeypatch):
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    opened: list[Path] = []
    monkeypatch.setattr(window.menus, "open_recipe", lambda path: opened.append(path) or True)
    window.menus.add_recent(first)
    window.menus.add_recent(second)
    actions = window.menus.recent_menu.actions()
    assert [a.text() for a in actions] == [str(second), str(first)]
    actions[1].trigger()
    assert opened == [first]


def test_about_action_shows_the_version(window, monkeypatch):
    from ram_desktop import __version__

    shown = []
    monkeypatch.setattr(QMessageBox, "about", lambda parent, title, text: shown.append((title, text)))
    _action(window.menuBar(), "&Help", "&About RAM Desktop").trigger()
    assert len(shown) == 1 and shown[0][0] == "About RAM Desktop" and __version__ in shown[0][1]
