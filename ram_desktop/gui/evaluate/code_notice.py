"""Asking before a suite's python scorer runs from a folder RAM Desktop did not write (docs/evaluate.md,
Scorers): Evaluate, Compare and Search ask the same way."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from PySide6.QtWidgets import QMessageBox, QWidget

from ...core import new_code_folders, remember_code_folders
from ...evaluate import LmEvalTask, Suite, scorer_folders


def confirm_code(parent: QWidget, suites: Sequence[Suite | LmEvalTask], info: Callable[[str], None]) -> bool:
    """The first time ``suites`` run a python scorer from a folder RAM Desktop did not write, ask Run /
    Cancel (docs/evaluate.md, Scorers). True when there is nothing new or the user chose Run; the
    folders are then remembered and not asked about again."""
    folders = scorer_folders(suites)
    new = new_code_folders(folders)
    if not new:
        return True
    listed = "\n".join(
        f"• {folder}  ({', '.join(sorted({file for _, file in folders[folder]}))}; suite "
        f"{', '.join(repr(name) for name, _ in folders[folder])})"
        for folder in new
    )
    box = QMessageBox(QMessageBox.Icon.Warning, "Run code from a suite folder?", "", parent=parent)
    box.setObjectName("code_notice")
    box.setText(f"This evaluation runs Python code from a folder RAM Desktop did not create:\n\n{listed}")
    box.setInformativeText(
        "A python scorer is a program: it runs with your rights (in a separate process, with a time "
        "limit per batch). Run it only if you trust where the folder came from. You are asked once per folder."
    )
    run = box.addButton("Run", QMessageBox.ButtonRole.AcceptRole)
    box.addButton(QMessageBox.StandardButton.Cancel)
    box.setDefaultButton(QMessageBox.StandardButton.Cancel)
    box.exec()
    if box.clickedButton() is not run:
        info("Not started: the suite's scorer code was not run.")
        return False
    remember_code_folders(folders)
    return True
