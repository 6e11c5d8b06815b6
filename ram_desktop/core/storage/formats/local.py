"""Local checkpoints: pick the format of a folder or file and open it; open a weights file for slices."""

from __future__ import annotations

from pathlib import Path

from ...errors import InputError
from ..safe_read import check_regular
from . import lora, pickle_format, safetensors_format
from .base import PICKLE_SUFFIXES, Checkpoint


def open_local(path: Path, spec: str | None = None) -> Checkpoint:
    """Open a local model folder (Hugging Face layout, single or sharded; safetensors, else pickle) or one
    weights file."""
    path = path.resolve()
    spec = spec or str(path)
    if not path.is_dir():
        check_regular(path)  # a FIFO, device or socket named as the model: refused, never opened
    if path.is_file():
        if path.suffix == ".safetensors":
            return safetensors_format.open_file(path, spec)
        if path.suffix in PICKLE_SUFFIXES:
            return pickle_format.open_pickle_file(path, spec)
        raise InputError(f"{path}: not a .safetensors file or a model folder")
    if lora.is_adapter_folder(path):  # a PEFT LoRA adapter: bound to the base when the plan is made
        return lora.open_adapter(path, spec)
    files = safetensors_format.weight_files(path)
    if files is None:
        return pickle_format.open_pickle_folder(path, spec)
    return safetensors_format.open_folder(path, files, spec)


def open_slices(file: Path):
    """A weights file opened for slice reads, by its format: safetensors through ``safe_open``, anything
    else as a PyTorch pickle (memory-mapped where possible)."""
    if lora.is_delta_file(file):
        return lora.open_delta(file)
    if file.suffix == ".safetensors" or file.resolve().suffix == ".safetensors":
        return safetensors_format.open_slices(file)
    return pickle_format.PickleHandle(file)
