"""Checkpoint formats: read a local checkpoint's files into a ``Checkpoint`` (files, tensor table,
config) without reading tensor data, and open a weights file for slicing.

A local safetensors folder or file (``safetensors_format``), a PyTorch pickle folder or file
(``pickle_format``, read only through ``torch.load(weights_only=True)``) or a LoRA adapter
(``lora``), picked by ``local.open_local``; ``registry.FORMATS`` is the one list of weight formats. The shared pieces (``Checkpoint``, ``TensorInfo``,
file-name constants, index parsing, path containment) live in ``base``. What the user named (a path
or a Hub id) is resolved by ``core.sources.open_checkpoint``.
"""

from __future__ import annotations

from .base import Checkpoint, TensorInfo, WeightFormat
from .local import open_local, open_slices
from .registry import FORMATS

__all__ = ["FORMATS", "Checkpoint", "TensorInfo", "WeightFormat", "open_local", "open_slices"]
