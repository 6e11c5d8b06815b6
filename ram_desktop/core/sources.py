"""What the user named → a ``Checkpoint`` (files, tensor table, config), without reading tensor data.

One resolver for every kind of source: a local folder or weights file opens through storage
(``storage.formats.open_local``: safetensors, PyTorch pickle, LoRA adapters); a Hugging Face Hub id
resolves to a cached snapshot folder through the ecosystem (``ecosystem.hub.source``), which then
opens like a local folder. ``MODEL+ADAPTER`` (mergekit's syntax) names a PEFT LoRA adapter applied to a model:
it opens as the adapter, bound later to the merge's base, which must be that model.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from .errors import InputError
from .events import Reporter
from .storage.formats import Checkpoint, lora, open_local

__all__ = ["HUB_ID", "open_checkpoint", "split_applied"]

HUB_ID = re.compile(r"^(?:hf://)?[A-Za-z0-9][\w.-]*/[\w.-]+(?:@[\w./-]+)?$")


def split_applied(text: str) -> tuple[str, str] | None:
    """``MODEL+ADAPTER`` as (model, adapter); None for a plain source (one that has no ``+``, or a local path
    that exists as written). More than one ``+`` is an ``InputError``, as in mergekit."""
    text = str(text).strip()
    if "+" not in text or (not text.startswith("hf://") and Path(text).expanduser().exists()):
        return None
    parts = [p.strip() for p in text.split("+")]
    if len(parts) != 2 or not all(parts):
        raise InputError(
            f"{text}: a source with '+' is MODEL+ADAPTER (a model and the LoRA adapter applied to it), "
            "with one '+' between two non-empty names"
        )
    return parts[0], parts[1]


def open_checkpoint(spec: str | Path, reporter: Reporter | None = None, token: str | None = None) -> Checkpoint:
    """Resolve a local folder, a weights file, or a Hub id (``org/name[@rev]``, ``hf://...``).

    A local path that exists always wins over a Hub id of the same spelling. ``token`` is used for
    Hub sources only (None: ``HF_TOKEN`` or the stored login); it is never stored in the result.
    """
    text = str(spec).strip()
    if not text:
        raise InputError("an empty source was given; name a model folder, a .safetensors file or a Hub id")
    applied = split_applied(text)
    if applied is not None:
        return _open_applied(text, *applied, reporter, token)
    path = Path(text).expanduser()
    if not text.startswith("hf://") and path.exists():
        return open_local(path, text)
    if HUB_ID.match(text) and not text.startswith(("/", ".", "~")):
        from .ecosystem.hub.source import open_hub  # imported lazily: huggingface_hub is only needed for Hub sources

        return open_hub(text, reporter or Reporter(), token=token)
    raise InputError(f"{text}: no such file or folder; check the path")


def _open_applied(text: str, model: str, adapter: str, reporter: Reporter | None, token: str | None) -> Checkpoint:
    """``MODEL+ADAPTER``: the adapter (a PEFT LoRA folder) with the model it is applied to."""
    model_ckpt = open_checkpoint(model, reporter, token)
    try:
        adapter_ckpt = open_checkpoint(adapter, reporter, token)
    except InputError as e:
        raise InputError(f"{text}: the adapter {adapter}: {e}") from None
    if not lora.is_lora(adapter_ckpt):
        raise InputError(
            f"{text}: {adapter} is not a LoRA adapter (a PEFT folder with {lora.ADAPTER_CONFIG} and "
            f"{lora.ADAPTER_WEIGHTS}); after '+' name the adapter applied to {model}"
        )
    if lora.is_lora(model_ckpt):
        raise InputError(f"{text}: {model} is a LoRA adapter; before '+' name the full model it is applied to")
    return replace(adapter_ckpt, spec=text, applied_to=model_ckpt)
