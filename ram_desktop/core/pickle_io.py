"""Folders and files without safetensors weights: PyTorch pickle checkpoints, or no weights at all."""

from __future__ import annotations

from pathlib import Path

from .errors import InputError
from .sources import Checkpoint

PICKLE_NAMES = ("pytorch_model.bin", "pytorch_model.bin.index.json")


def open_pickle_folder(folder: Path, spec: str) -> Checkpoint:
    """A model folder with no .safetensors file."""
    for name in PICKLE_NAMES:
        if (folder / name).is_file():
            return open_pickle_file(folder / name, spec)
    raise InputError(
        f"{folder}: no model weights found (expected model.safetensors, {('model.safetensors.index.json')} "
        "or shards); point at a Hugging Face model folder or a .safetensors file"
    )


def open_pickle_file(path: Path, spec: str) -> Checkpoint:
    """PyTorch pickle checkpoints are not read yet: say how to convert them."""
    raise InputError(
        f"{path}: PyTorch pickle checkpoints are not supported; convert it to safetensors "
        "(e.g. with transformers: model.save_pretrained(dir, safe_serialization=True))"
    )
