"""What every checkpoint format shares: the tensor table entry, the ``Checkpoint``, the ``WeightFormat`` each
format module declares (``registry.FORMATS`` lists them), the file-name constants, index parsing and path
containment. Imports nothing else of the formats package."""

from __future__ import annotations

import math
import os
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ...errors import InputError
from ...lazy import torch
from ..safe_read import read_json

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
PICKLE_INDEX = "pytorch_model.bin.index.json"
PICKLE_SINGLE = "pytorch_model.bin"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")

# safetensors dtype code -> (torch's name for it, bytes per element, numpy type of its stored bits: what the
# fused kernels and the torch-free reader use; bfloat16 as uint16 and float16 as int16, see ``kernels.as_bits``)
DTYPE_TABLE: dict[str, tuple[str, int, type]] = {
    "F64": ("float64", 8, np.float64),
    "F32": ("float32", 4, np.float32),
    "F16": ("float16", 2, np.int16),
    "BF16": ("bfloat16", 2, np.uint16),
    "I64": ("int64", 8, np.int64),
    "I32": ("int32", 4, np.int32),
    "I16": ("int16", 2, np.int16),
    "I8": ("int8", 1, np.int8),
    "U8": ("uint8", 1, np.uint8),
    "BOOL": ("bool", 1, np.bool_),
    "F8_E4M3": ("float8_e4m3fn", 1, np.uint8),
    "F8_E5M2": ("float8_e5m2", 1, np.uint8),
}
CODE_OF_NAME: dict[str, str] = {name: code for code, (name, _, _) in DTYPE_TABLE.items()}
ITEMSIZE_OF_NAME: dict[str, int] = {name: size for name, size, _ in DTYPE_TABLE.values()}
FLOAT_CODES = frozenset({"F64", "F32", "F16", "BF16"})  # what the engine computes exactly
# those floats by name -> the numpy type of their stored bits, and back (unambiguous among floats)
FLOAT_BITS: dict[str, type] = {DTYPE_TABLE[c][0]: DTYPE_TABLE[c][2] for c in sorted(FLOAT_CODES)}
FLOAT_OF_BITS: dict[np.dtype, str] = {np.dtype(bits): name for name, bits in FLOAT_BITS.items()}
SCALED_FLOAT_CODES = frozenset({"F8_E4M3", "F8_E5M2"})  # floats it cannot: refused, never copied as if unchanged


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as its header describes it."""

    name: str
    dtype: str  # safetensors code, e.g. "BF16"
    shape: tuple[int, ...]
    file: Path

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def dtype_name(self) -> str:
        """torch's name for the stored dtype, e.g. "bfloat16"."""
        return DTYPE_TABLE[self.dtype][0]

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch_dtype(self.dtype_name)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_TABLE[self.dtype][1]

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_CODES


@runtime_checkable
class BitsHandle(Protocol):
    """An open weights file that also hands out a tensor's stored bits as a numpy view (what the fused kernels
    read): ``bits(name, start, stop)`` for flat elements ``start`` .. ``stop``."""

    def bits(self, name: str, start: int, stop: int) -> np.ndarray: ...


@dataclass(frozen=True)
class WeightFormat:
    """One weights format, as its module declares it (``FORMAT``) and ``registry.FORMATS`` lists it.

    ``name``: its name in listings ("safetensors", "bin"). ``label``: its name in a file dialog. ``suffixes``:
    the file suffixes of one weights file in it, the first one its shards' (a ``.bin`` shard, a
    ``.safetensors`` shard). ``files``: a model folder's standard weight files in it, as error messages list
    them. ``pick(names)``: of a folder's or repository's root file names, the weight files to read (an index
    first) or None when it has none in this format. ``open_folder(folder, spec)``: the folder as a
    ``Checkpoint``, or None when it holds no weights of this format (the next format is tried).
    ``open_file(path, spec)``: one weights file (or an index) as a ``Checkpoint``. ``open_slices(file)``: the
    file opened for slice reads: ``get_slice(name)[a:b]``, ``get_tensor(name)``, a context manager, and
    ``bits`` too where the format can hand out stored bits (``BitsHandle``)."""

    name: str
    label: str
    suffixes: tuple[str, ...]
    files: tuple[str, ...]
    pick: Callable[[list[str]], list[str] | None]
    open_folder: Callable[[Path, str], Checkpoint | None]
    open_file: Callable[[Path, str], Checkpoint]
    open_slices: Callable[[Path], Any]

    def reads(self, path: Path) -> bool:
        """Whether ``path`` (a file, or the file a link names) is a weights file of this format, by its suffix."""
        return path.suffix in self.suffixes or path.resolve().suffix in self.suffixes


@dataclass
class Checkpoint:
    """A base model or an agent, resolved to local files and read as far as its headers."""

    spec: str  # what the user typed
    path: Path  # local folder, or the single weights file
    files: list[Path]
    tensors: dict[str, TensorInfo]
    config: dict | None = None
    revision: str | None = None  # resolved Hub commit, when the source came from the Hub
    repo_id: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    # a LoRA adapter named as ``MODEL+ADAPTER``: the model it is applied to (it must be the merge's base)
    applied_to: Checkpoint | None = None

    @property
    def folder(self) -> Path:
        """The folder holding config and tokenizer files (the file's parent for a single file)."""
        return self.path if self.path.is_dir() else self.path.parent

    @property
    def size_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    @property
    def n_params(self) -> int:
        return sum(t.numel for t in self.tensors.values())

    @property
    def dtype(self) -> str:
        """The most common floating dtype by element count (e.g. "BF16"), or "-" when none."""
        counts: Counter[str] = Counter()
        for t in self.tensors.values():
            if t.is_float:
                counts[t.dtype] += t.numel
        return counts.most_common(1)[0][0] if counts else "-"

    @property
    def display(self) -> str:
        """How the source appears in reports and cards: the Hub id with its commit, or the path."""
        if self.repo_id:
            return f"{self.repo_id}@{self.revision}" if self.revision else self.repo_id
        return str(self.path)


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype called ``name`` ("bfloat16"); imports torch (``lazy``)."""
    return getattr(torch, name)


def dtype_name(dtype: torch.dtype) -> str:
    """torch's name of a torch dtype ("bfloat16" for torch.bfloat16)."""
    return str(dtype).removeprefix("torch.")


def contained(folder: Path, name: str) -> bool:
    """Whether ``folder / name`` stays inside ``folder`` as written (no absolute path, no ``..`` escape).

    Checked on the path as written, so that shards which are symlinks (the Hugging Face cache links
    snapshot files to blobs/) are accepted, while "../x" is not."""
    if os.path.isabs(name):
        return False
    root = os.path.normpath(str(folder))
    norm = os.path.normpath(os.path.join(str(folder), name))
    return os.path.commonpath([norm, root]) == root and norm != root


def read_index(index: Path, where: str | None = None) -> dict[str, str]:
    """The ``weight_map`` (tensor name → shard file name) of a sharded checkpoint's index, validated:
    a JSON object with a ``weight_map`` object whose keys and values are strings, every shard inside
    the folder. ``where`` names the source in messages (default: the index path)."""
    where = where or str(index)
    value = read_json(index)
    if not isinstance(value, dict) or "weight_map" not in value:
        raise InputError(f'{where}: not a valid index (needs a JSON object with a "weight_map")')
    weight_map = value["weight_map"]
    if not isinstance(weight_map, dict):
        raise InputError(f'{where}: not a valid index (its "weight_map" must map tensor names to file names)')
    for name, file in weight_map.items():
        if not isinstance(file, str) or not file:
            raise InputError(
                f"{where}: the index maps tensor {name!r} to {file!r}, which is not a file name; "
                "re-download or re-save the checkpoint"
            )
        if not contained(index.parent, file):
            raise InputError(f"{where}: names {file!r}, which is outside the model folder; refusing to read it")
    return weight_map


def index_shards(index: Path, where: str | None = None) -> list[Path]:
    """The shard files an index names, each checked to exist (not resolved: errors name the file, not a
    cache blob)."""
    folder = index.parent
    files = []
    for name in sorted(set(read_index(index, where).values())):
        file = folder / os.path.normpath(name)
        if not file.exists():  # something else than a regular file is refused by the reader, by name
            raise InputError(f"{where or index}: names shard {name!r}, which is missing from {folder}; re-download it")
        files.append(file)
    return files


def check_index_covers(index: Path, tensors: dict[str, TensorInfo]) -> None:
    """Every tensor the index names is held by the shard it names; raise naming the first few that are not."""
    folder = index.parent
    problems = []
    for name, file in read_index(index).items():
        info = tensors.get(name)
        if info is None:
            problems.append(f"{name!r} (no shard holds it; the index says {file})")
        elif os.path.normpath(str(folder / file)) != os.path.normpath(str(info.file)):
            problems.append(f"{name!r} (the index says {file}, but it is in {info.file.name})")
    if problems:
        shown = "; ".join(problems[:5]) + ("; ..." if len(problems) > 5 else "")
        raise InputError(
            f"{index}: the index names {len(problems)} tensor(s) its shards do not hold as it says: "
            f"{shown}; the checkpoint is incomplete or the index is stale — re-download or re-save it"
        )


def read_config(folder: Path) -> dict | None:
    """The folder's ``config.json`` as an object (None when there is none, or it is not an object); a FIFO,
    device or folder in its place, invalid JSON, repeated keys, deep nesting or non-UTF-8 are refused."""
    config = folder / "config.json"
    if not config.exists():
        return None
    value = read_json(config)
    return value if isinstance(value, dict) else None


# ---- digests of files this process wrote -----------------------------------------------------------------------

CONTENT_DIGEST = "xxh3_128"  # the manifest's content hash: detects a changed file (not forgery: the manifest
# itself is a plain file anyone can rewrite), at ~7 GB/s where SHA-256 runs at ~1.2 GB/s on one core


def content_hasher() -> Any:
    """A fresh ``CONTENT_DIGEST`` hasher (``update(bytes)``, releasing the GIL; ``hexdigest()``)."""
    import xxhash

    return xxhash.xxh3_128()


_WRITTEN_DIGESTS: dict[str, tuple[tuple[int, int, int], str]] = {}
_WRITTEN_LOCK = threading.Lock()


def _stat_identity(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns


def remember_written_digest(path: Path, digest: str) -> None:
    """The ``CONTENT_DIGEST`` of a file this process has just written, hashed as its bytes were written (the
    writer thread hashes beside the merge), so that the output's manifest need not read the file back."""
    with _WRITTEN_LOCK:
        _WRITTEN_DIGESTS[os.path.abspath(path)] = (_stat_identity(path), digest)


def written_digest(path: Path) -> str | None:
    """The remembered digest of ``path`` (taken once: a later check hashes the file again), or None when it was
    not written by this process or changed since (inode, size or modification time)."""
    with _WRITTEN_LOCK:
        held = _WRITTEN_DIGESTS.pop(os.path.abspath(path), None)
    if held is None:
        return None
    try:
        return held[1] if _stat_identity(path) == held[0] else None
    except OSError:
        return None
    try:
        return held[1] if _stat_identity(path) == held[0] else None
    except OSError:
        return None
