"""What the user named → a ``Checkpoint`` (files, tensor table, config), without reading tensor data.

One resolver for every kind of source: a local folder or weights file opens through storage
(``storage.formats.open_local``: safetensors, PyTorch pickle, LoRA adapters); a Hugging Face Hub id
resolves to a cached snapshot folder through the ecosystem (``ecosystem.hub.source``), which then
opens like a local folder.
"""

from __future__ import annotations

import re
from pathlib import Path

from .errors import InputError
from .events import Reporter
from .storage.formats import Checkpoint, open_local

__all__ = ["HUB_ID", "open_checkpoint"]

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
        from .ecosystem.hub.source import open_hub  # imported lazily: huggingface_hub is only needed for Hub sources

        return open_hub(text, reporter or Reporter(), token=token)
    raise InputError(f"{text}: no such file or folder; check the path")
