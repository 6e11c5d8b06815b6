"""The "Add from Hub…" dialog, offscreen, with huggingface_hub's model_info replaced."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from types import SimpleNamespace

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

import huggingface_hub as hf
from huggingface_hub.hf_api import RepoSibling
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLineEdit

from ram_desktop.gui.sources.hub_dialog import HubDialog

from .hubcache import not_found

SHA = "0123456789abcdef0123456789abcdef01234567"
FILES = {
    "config.json": 700,
    "generation_config.json": 200,
    "tokenizer.json": 7_000_000,
    "tokenizer_config.json": 7000,
    "model.safetensors.index.json": 30_000,
    "model-00001-of-00002.safetensors": 3_900_000_000,
    "model-00002-of-00002.safetensors": 3_100_000_000,
    "README.md": 5000,
    "original/consolidated.pth": 8_000,
}


@pytest.fixture
def online(monkeypatch):
    calls = []

    def model_info(repo_id, *, revision=None, files_metadata=False, token=None, **kw):
        calls.append((repo_id, revision, files_metadata, token))
        if repo_id == "org/gated":
            raise not_found(hf.errors.GatedRepoError, repo_id, 403)
        return SimpleNamespace(
            id=repo_id,
            sha=SHA,
            siblings=[RepoSibling(rfilename=n, size=s) for n, s in FILES.items()],
            gated=False,
            private=False,
        )

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(hf, "model_info", model_info)
    return calls


def _ok(dialog):
    return dialog.buttons.button(QDialogButtonBox.StandardButton.Ok)


def test_lists_files_and_sizes_before_downloading(qtbot, online):
    dialog = HubDialog()
    qtbot.addWidget(dialog)
    assert not _ok(dialog).isEnabled()
    dialog.repo_edit.setText("org/model")
    dialog.revision_edit.setText("v1.0")
    dialog.token_edit.setText("hf_dialogSECRET")
    assert dialog.token_edit.echoMode() == QLineEdit.EchoMode.Password
    dialog.list_button.click()
    qtbot.waitUntil(lambda: dialog.listing() is not None, timeout=5000)
    assert online == [("org/model", "v1.0", True, "hf_dialogSECRET")]
    rows = {
        dialog.table.item(r, 1).text(): (dialog.table.item(r, 0).text(), dialog.table.item(r, 2).text())
        for r in range(dialog.table.rowCount())
    }
    assert set(rows) == set(FILES)
    assert rows["model-00001-of-00002.safetensors"] == ("✓", "3.90 GB")
    assert rows["config.json"][0] == "✓" and rows["README.md"][0] == "" and rows["original/consolidated.pth"][0] == ""
    assert SHA[:12] in dialog.status.text() and "7.01 GB" in dialog.status.text()
    assert "hf_dialogSECRET" not in dialog.status.text()
    assert _ok(dialog).isEnabled()
    assert dialog.spec() == "org/model@v1.0" and dialog.token() == "hf_dialogSECRET"
    assert dialog.repo_id() == "org/model" and dialog.revision() == "v1.0"


def test_hub_error_is_shown_in_the_dialog(qtbot, online):
    dialog = HubDialog(repo_id="org/gated")
    qtbot.addWidget(dialog)
    dialog.list_files()
    qtbot.waitUntil(lambda: "gated repository" in dialog.status.text(), timeout=5000)
    assert dialog.listing() is None and dialog.table.rowCount() == 0
    assert dialog.status.text().startswith("org/gated:")


def test_offline_shows_a_clear_message(qtbot, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hf, "model_info", lambda *a, **k: pytest.fail("model_info must not be called offline"))
    dialog = HubDialog(repo_id="org/model")
    qtbot.addWidget(dialog)
    assert "Offline" in dialog.status.text() and "local Hugging Face cache" in dialog.status.text()
    assert not dialog.list_button.isEnabled()
    dialog.list_files()
    assert _ok(dialog).isEnabled() and dialog.spec() == "org/model" and dialog.token() is None


def test_invalid_ids_cannot_be_added(qtbot):
    dialog = HubDialog()
    qtbot.addWidget(dialog)
    for text in ("noslash", "org/name@rev", "../x/y", ""):
        dialog.repo_edit.setText(text)
        assert not _ok(dialog).isEnabled() and dialog.spec() == "", text
    dialog.repo_edit.setText("  Qwen/Qwen2.5-7B-Instruct ")
    assert _ok(dialog).isEnabled() and dialog.spec() == "Qwen/Qwen2.5-7B-Instruct"


def test_a_failed_listing_disables_add_until_the_id_revision_or_token_changes(qtbot, online):
    dialog = HubDialog(repo_id="org/gated")
    qtbot.addWidget(dialog)
    assert _ok(dialog).isEnabled()  # listing is not required
    dialog.list_files()
    qtbot.waitUntil(lambda: "gated repository" in dialog.status.text(), timeout=5000)
    assert not _ok(dialog).isEnabled()  # nothing valid to add
    assert "could not list" in _ok(dialog).toolTip()
    dialog.accept()  # Enter in a field: refused as the button is
    assert dialog.result() != QDialog.DialogCode.Accepted
    dialog.token_edit.setText("hf_withAccess")  # a token may open the gated repository
    assert _ok(dialog).isEnabled() and _ok(dialog).toolTip() == ""
    dialog.token_edit.setText("")
    assert not _ok(dialog).isEnabled()
    dialog.repo_edit.setText("org/model")
    assert _ok(dialog).isEnabled()
    dialog.list_files()
    qtbot.waitUntil(lambda: dialog.listing() is not None, timeout=5000)
    assert _ok(dialog).isEnabled()
