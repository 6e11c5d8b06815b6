"""Weight sources: turn what the user named into a ``Checkpoint`` (files, tensor table, config) without
reading tensor data, and open a weights file for slicing.

One resolver for every kind of checkpoint: a local safetensors folder or file
(``safetensors_format``), a PyTorch pickle folder or file (``pickle_format``, read only through
``torch.load(weights_only=True)``), or a Hugging Face Hub id resolved to a cached snapshot folder
(``hub``), which then opens like a local folder. The shared pieces (``Checkpoint``, ``TensorInfo``,
file-name constants, index parsing, path containment) live in ``base``.
"""

from __future__ import annotations

import re
from pathlib import Path

from ...errors import InputError
from ...events import Reporter
from .base import Checkpoint, TensorInfo
from .local import open_local, open_slices

__all__ = ["Checkpoint", "TensorInfo", "open_checkpoint", "open_local", "open_slices"]

HUB_ID = re.compile(r"^(?:hf://)?[A-Za-z0-9][\w.-]*/[\w.-]+(?:@[\w./-]+)?$")


def open_checkpoint(spec: str | Path, reporter: Reporter | None = None, token: str | None = None) -> Checkpoint:
    """Resolve a local folder, a weights file, or a Hub id (``org/name[@rev]``, ``hf://...``).

    A local path that exists always wins over a Hub id of the same spelling. ``token`` is used for
    Hub sources only (None: ``HF_TOKEN`` or the stored login); it is never stored in the result.
    """
    text = str(spec).strip()
    if not text:
        raise InputError("an empty source was given; name a model folder, a .safetensors file or a Hub id")
    path = Path(text).expanduser()
    if not text.startswith("hf://") and path.exists():
        return open_local(path, text)
    if HUB_ID.match(text) and not text.startswith(("/", ".", "~")):
        from .hub import open_hub  # imported lazily: huggingface_hub is only needed for Hub sources

        return open_hub(text, reporter or Reporter(), token=token)
    raise InputError(f"{text}: no such file or folder; check the path")
