"""Hub sources in the window: the Add from Hub dialog's token reaches the Hub, and is never stored."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialog, QDialogButtonBox

from ram_desktop.gui.sources import panel as sources_panel

from ..conftest import make_models
from ..hubcache import FakeHub, sha_of
from .conftest import analyse, merge

SECRET = "hf_windowSECRETtoken789"


@pytest.fixture
def hub(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    base, agents = make_models(tmp_path / "local")
    return FakeHub(monkeypatch, {f"org/{f.name}": (f, sha_of(f.name)) for f in [base, *agents]})


def _answer_dialog(monkeypatch, repo: str, token: str | None) -> None:
    """The modal dialog, answered as a user would: type the id and token, press OK."""

    def exec_(dialog: QDialog) -> int:
        dialog.repo_edit.setText(repo)
        if token:
            dialog.token_edit.setText(token)
        return QDialog.Accepted

    monkeypatch.setattr(sources_panel.HubDialog, "exec", exec_)


def test_add_from_hub_downloads_with_token_and_merges(qtbot, window, hub, monkeypatch, tmp_path, settings):
    for repo, token in (("org/base", SECRET), ("org/alpha", None), ("org/beta", None)):
        _answer_dialog(monkeypatch, repo, token)
        qtbot.mouseClick(window.sources.add_hub_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: window.sources.all_ready(), timeout=20000)
    assert window.sources.base.checkpoint.revision == sha_of("base")
    assert [r.name for r in window.sources.agents] == ["alpha", "beta"]
    assert set(hub.tokens) == {SECRET}  # the dialog's token, for every source of the session
    analyse(qtbot, window)
    out = tmp_path / "merged"
    window.method.out_dir.setText(str(out))
    merge(qtbot, window)
    recipe = (out / "ram-recipe.yaml").read_text()
    assert f"org/base@{sha_of('base')}" in recipe
    window.save_settings()
    settings.sync()
    stored = Path(settings.fileName()).read_text(encoding="utf-8", errors="replace")
    for text in [recipe, stored, (out / "merge-report.json").read_text(), window.log_view.toPlainText()]:
        assert SECRET not in text


def test_a_repository_the_hub_cannot_list_adds_no_error_row(qtbot, window, hub, monkeypatch):
    """The user types an id the Hub does not know, waits for the listing, then clicks Add: Add is disabled, so
    the dialog is not accepted and the sources get no row that can only fail."""

    def exec_(dialog: QDialog) -> int:
        dialog.repo_edit.setText("org/missing")
        dialog.list_files()
        qtbot.waitUntil(lambda: dialog.status.text().startswith("org/missing"), timeout=5000)
        qtbot.mouseClick(dialog.buttons.button(QDialogButtonBox.StandardButton.Ok), Qt.LeftButton)
        return dialog.result()

    monkeypatch.setattr(sources_panel.HubDialog, "exec", exec_)
    qtbot.mouseClick(window.sources.add_hub_button, Qt.LeftButton)
    assert window.sources.base is None and window.sources.agents == []
    assert not window.sources.busy and not window.sources.errors()
