"""Checkpoint formats: read a local checkpoint's files into a ``Checkpoint`` (files, tensor table,
config) without reading tensor data, and open a weights file for slicing.

A local safetensors folder or file (``safetensors_format``), a PyTorch pickle folder or file
(``pickle_format``, read only through ``torch.load(weights_only=True)``) or a LoRA adapter
(``lora``), picked by ``local.open_local``. The shared pieces (``Checkpoint``, ``TensorInfo``,
file-name constants, index parsing, path containment) live in ``base``. What the user named (a path
or a Hub id) is resolved by ``core.sources.open_checkpoint``.
"""

from __future__ import annotations

from .base import Checkpoint, TensorInfo
from .local import open_local, open_slices

__all__ = ["Checkpoint", "TensorInfo", "open_local", "open_slices"]
