"""The sources table's rows (the base, then the agents) and what their status says: an agent is "ready" only
once its headers are checked against the base shown (``check_fits``), so after Change base no agent says
"ready" until it fits the new base, and one of another shape never does."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

from ...core import Checkpoint, InputError, check_fits


def default_name(spec: str) -> str:
    text = spec.rstrip("/\\")
    text = text.removeprefix("hf://")
    text = text.split("@")[0]
    name = Path(text).name
    return name.removesuffix(".safetensors") or "agent"


_ROW_KEYS = itertools.count(1)


@dataclass
class Row:
    spec: str
    name: str
    slot: int = 0  # the agent's colour (``model_color``), kept through reorder, rename and others' removal
    key: int = field(default_factory=lambda: next(_ROW_KEYS))  # identity: per-agent values follow it
    checkpoint: Checkpoint | None = None
    error: str | None = None
    rejected: str | None = None  # why the last analysis or merge refused this opened source
    checked: bool = False  # an opened agent checked against the base shown (its headers: ``check_fits``)
    mismatch: str | None = None  # why that check found it does not fit the base
    generation: int = 0
    status: str = "opening…"

    @property
    def ready(self) -> bool:
        return self.checkpoint is not None


def check_agents(base: Row | None, agents: list[Row]) -> tuple[int, Row] | None:
    """Check every opened agent against the opened base (names and shapes, from the headers); an agent is left
    unchecked while there is no opened base. Returns the first agent newly found not to fit, with its index."""
    opened = base.checkpoint if base is not None else None
    found = None
    for i, row in enumerate(agents):
        before = row.mismatch
        row.checked, row.mismatch = False, None
        if opened is None or row.checkpoint is None:
            continue
        try:
            check_fits(opened, row.checkpoint)
        except InputError as e:
            row.mismatch = str(e)
        row.checked = True
        if row.mismatch and row.mismatch != before and found is None:
            found = (i, row)
    return found


def status_text(role: str, row: Row, base: Row | None) -> str:
    """An opened row's status: an agent is ready only once checked against the base shown."""
    if row.rejected:
        return "✗ rejected"
    if role == "base" or row.checked:
        return "✗ mismatch" if row.mismatch else "✓ ready"
    return "checking…" if base is not None and base.error is None else "not checked"


def unchecked_reason(base: Row | None) -> str:
    if base is None or base.error is not None:
        return "Not checked: it is checked against the base once a base opens (Base…)"
    return "Checking it against the new base (its tensor names and shapes) once the base opens"


def merge_blocker(base: Row | None, agents: list[Row]) -> str | None:
    """Why a merge cannot run with these opened rows (one does not fit the base, or the analysis refused it),
    naming the row and the fix; None when nothing blocks it."""
    rows = [("the base", base), *((f"agent {i + 1} ({r.name})", r) for i, r in enumerate(agents))]
    for label, r in rows:
        if r is not None and r.mismatch:
            return (
                f"{label} does not fit the base ({r.mismatch}). Choose the base it was fine-tuned from "
                "(Change base…), or remove it (select its row, then Remove) to merge the others"
            )
        if r is not None and r.rejected:
            return (
                f"{label} blocks the merge: the analysis refused it ({r.rejected}). "
                f"Remove it (select its row, then Remove) to merge the others"
            )
    return None
