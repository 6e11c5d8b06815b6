"""Local checkpoints: pick the format of a folder or file and open it; open a weights file for slices.
The formats are ``registry.FORMATS``; a LoRA adapter (``lora``) is bound to its base later."""

from __future__ import annotations

from pathlib import Path

from ...errors import InputError
from ..safe_read import check_regular
from . import lora, registry
from .base import Checkpoint


def open_local(path: Path, spec: str | None = None) -> Checkpoint:
    """Open a local model folder (Hugging Face layout, single or sharded; in the first format of
    ``registry.FORMATS`` it holds) or one weights file."""
    path = path.resolve()
    spec = spec or str(path)
    if not path.is_dir():
        check_regular(path)  # a FIFO, device or socket named as the model: refused, never opened
    if path.is_file():
        fmt = registry.format_of(path)
        if fmt is None:
            suffixes = ", ".join(s for f in registry.FORMATS for s in f.suffixes)
            raise InputError(f"{path}: not a weights file ({suffixes}) or a model folder")
        return fmt.open_file(path, spec)
    if lora.is_adapter_folder(path):  # a PEFT LoRA adapter: bound to the base when the plan is made
        return lora.open_adapter(path, spec)
    for fmt in registry.FORMATS:
        checkpoint = fmt.open_folder(path, spec)
        if checkpoint is not None:
            return checkpoint
    raise InputError(
        f"{path}: no model weights found (expected {registry.standard_files()}); point at a Hugging Face model folder or a "
        "weights file"
    )


def open_slices(file: Path):
    """A weights file opened for slice reads, by its format (a file of none is read as the last format, a
    PyTorch pickle, memory-mapped where possible)."""
    if lora.is_delta_file(file):
        return lora.open_delta(file)
    return (registry.format_of(file) or registry.FORMATS[-1]).open_slices(file)
