"""The one list of weight formats. A new format is a ``<name>_format.py`` module declaring its ``FORMAT``
(``base.WeightFormat``) plus one line here; opening local checkpoints (``local``), the Hub's choice of files
(``core.ecosystem.hub.source``) and the window's file dialog read this list."""

from __future__ import annotations

from pathlib import Path

from . import pickle_format, safetensors_format
from .base import WeightFormat

FORMATS: tuple[WeightFormat, ...] = (  # in order of preference: a folder holding several is read in the first
    safetensors_format.FORMAT,
    pickle_format.FORMAT,
)


def format_of(path: Path) -> WeightFormat | None:
    """The format of one weights file, by its suffix (or that of the file a link names); None for none."""
    return next((f for f in FORMATS if f.reads(path)), None)  # FORMATS read at call time: a test may add one


def standard_files() -> str:
    """A model folder's standard weight files in every format, as error messages list them."""
    names = [name for f in FORMATS for name in f.files]
    return ", ".join(names[:-1]) + " or " + names[-1]


def weights_file_filter() -> str:
    """A Qt file-dialog filter: every format's weight files, each format, then every file."""
    patterns = {f.label: " ".join(f"*{s}" for s in f.suffixes) for f in FORMATS}
    every = " ".join(patterns.values())
    return ";;".join([f"Weights ({every})", *(f"{label} ({p})" for label, p in patterns.items()), "All files (*)"])
