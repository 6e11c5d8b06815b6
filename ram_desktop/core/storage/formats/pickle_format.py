"""PyTorch pickle checkpoints (``pytorch_model.bin``, sharded ``pytorch_model.bin.index.json``, ``.pt``).

They are read **only** through ``torch.load(weights_only=True)``: torch's restricted unpickler, which
accepts tensors, storages and plain containers and refuses every other global, so a checkpoint that
would run code on load is refused with an ``InputError`` and its code never runs. Zip-format files
(every ``torch.save`` since torch 1.6) are memory-mapped (``mmap=True``), so opening reads only the
pickle's small record and tensor data is paged in as slices are read; legacy (pre-zip) files cannot be
mapped and are loaded whole.

``PickleHandle`` mimics the part of ``safetensors.safe_open`` the streaming reader uses
(``get_slice(name)[a:b]`` and ``get_tensor``), so the streaming reader serves ``.bin`` slices too.
"""

from __future__ import annotations

import logging
import pickle
import warnings
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from ...errors import InputError
from ...lazy import torch
from ..safe_read import check_regular
from .base import (
    CODE_OF_NAME,
    PICKLE_INDEX,
    PICKLE_SINGLE,
    PICKLE_SUFFIXES,
    Checkpoint,
    TensorInfo,
    WeightFormat,
    check_index_covers,
    dtype_name,
    index_shards,
    read_config,
)

if TYPE_CHECKING:
    from typing_extensions import Self

log = logging.getLogger("ram_desktop")

WRAPPER_KEYS = ("state_dict", "model_state_dict")  # {"state_dict": {...}, ...} as training frameworks save


def open_pickle_folder(folder: Path, spec: str) -> Checkpoint | None:
    """A model folder with ``pytorch_model.bin.index.json`` or ``pytorch_model.bin``; None when it has neither."""
    if (folder / PICKLE_INDEX).exists():  # exists: a FIFO or folder of that name is refused by its reader
        return _open_index(folder, folder / PICKLE_INDEX, spec)
    if (folder / PICKLE_SINGLE).exists():
        return _open_files(folder, [folder / PICKLE_SINGLE], spec)
    return None


def pick(names: list[str]) -> list[str] | None:
    """Of a repository's root file names, the pickle weights to download: the index, else ``pytorch_model.bin``."""
    root = [n for n in names if "/" not in n]
    for name in (PICKLE_INDEX, PICKLE_SINGLE):
        if name in root:
            return [name]
    return None


def open_pickle_file(path: Path, spec: str) -> Checkpoint:
    """One pickle checkpoint file (``.bin``, ``.pt``, ``.pth``, ``.ckpt``, ``.pkl``), or a ``.bin`` index."""
    if path.name.endswith(".index.json"):
        return _open_index(path.parent, path, spec)
    ckpt = _open_files(path.parent, [path], spec)
    ckpt.path = path
    return ckpt


def _open_index(folder: Path, index: Path, spec: str) -> Checkpoint:
    ckpt = _open_files(folder, index_shards(index), spec)
    check_index_covers(index, ckpt.tensors)
    return ckpt


def _open_files(folder: Path, files: list[Path], spec: str) -> Checkpoint:
    tensors: dict[str, TensorInfo] = {}
    for file in files:
        state = load_state_dict(file)
        for name, value in state.items():
            if name in tensors:
                raise InputError(f"{folder}: tensor {name!r} appears in both {tensors[name].file.name} and {file.name}")
            code = CODE_OF_NAME.get(dtype_name(value.dtype))
            if code is None:
                raise InputError(f"{file}: tensor {name!r} has dtype {value.dtype}, which RAM Desktop cannot read")
            tensors[name] = TensorInfo(name, code, tuple(value.shape), file)
        del state
    if not tensors:
        raise InputError(f"{folder}: the checkpoint holds no tensors")
    return Checkpoint(spec, folder, files, tensors, read_config(folder), metadata={"format": "pt"})


def load_state_dict(file: Path) -> dict[str, torch.Tensor]:
    """``torch.load(file, weights_only=True)``, memory-mapped where the format allows, as a flat name → tensor
    dict. Raises ``InputError`` for a pickle that needs code, a corrupt file, or content that is not tensors."""
    check_regular(file)  # torch.load and zipfile open it themselves: a FIFO would block them
    try:
        obj = _load(file, mmap=zipfile.is_zipfile(file))
    except pickle.UnpicklingError as e:
        reason = str(e).splitlines()[0] if str(e) else e.__class__.__name__
        detail = next((line.strip() for line in str(e).splitlines() if "GLOBAL" in line or "Unsupported" in line), "")
        raise InputError(
            f"{file}: refused — this pickle checkpoint needs code to load ({detail or reason}); RAM Desktop only "
            "loads PyTorch checkpoints with torch.load(weights_only=True) and never runs code from a checkpoint. "
            "Convert it to safetensors in an environment you trust, or use a safetensors copy"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile) as e:
        text = str(e).splitlines()[0] if str(e) else e.__class__.__name__
        raise InputError(
            f"{file}: cannot read this PyTorch checkpoint ({text}); the file is corrupt or truncated — re-download it"
        ) from None
    if isinstance(obj, dict):
        for key in WRAPPER_KEYS:
            if isinstance(obj.get(key), dict) and not isinstance(obj.get(key), torch.Tensor):
                obj = obj[key]
                break
    if not isinstance(obj, dict):
        raise InputError(f"{file}: holds a {type(obj).__name__}, not a state dict of tensors")
    state: dict[str, torch.Tensor] = {}
    skipped = []
    for name, value in obj.items():
        if isinstance(value, torch.Tensor):
            state[str(name)] = value
        else:
            skipped.append(str(name))
    if skipped:
        log.warning(
            "%s: ignoring %d entries that are not tensors (%s%s)",
            file,
            len(skipped),
            ", ".join(skipped[:5]),
            ", ..." if len(skipped) > 5 else "",
        )
    return state


def _load(file: Path, mmap: bool) -> object:
    # torch warns on stderr about a pickle protocol its restricted unpickler may not support; the file is
    # then either read or refused with one clear error, so the warning only adds noise before that line
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
        if mmap:
            try:
                return torch.load(str(file), map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError:  # not mappable (torch wants the zip signature first), or corrupt: read it whole,
                pass  # which loads it or raises the error the caller reports; no branching on torch's message
        return torch.load(str(file), map_location="cpu", weights_only=True)


class PickleHandle:
    """What ``SliceReader`` needs from an open weights file, over a loaded (memory-mapped) state dict."""

    def __init__(self, file: Path) -> None:
        self.file = file
        self.state = load_state_dict(file)

    def get_slice(self, name: str) -> _Slice:
        return _Slice(self.state[name])

    def get_tensor(self, name: str) -> torch.Tensor:
        return self.state[name].clone()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.state = {}


class _Slice:
    """``handle.get_slice(name)[a:b]`` returns a fresh tensor (never a view of the mapped file), like safetensors."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def get_shape(self) -> list[int]:
        return list(self.tensor.shape)

    def __getitem__(self, key: slice | tuple[slice, ...]) -> torch.Tensor:
        return self.tensor[key].clone()


FORMAT = WeightFormat(
    "bin",
    "PyTorch pickle",
    PICKLE_SUFFIXES,
    (PICKLE_SINGLE, PICKLE_INDEX),
    pick,
    open_pickle_folder,
    open_pickle_file,
    PickleHandle,
)
