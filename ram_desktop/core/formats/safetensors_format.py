"""Safetensors checkpoints: folders (single file or sharded with an index) and single files; headers
read and validated without touching tensor data; slices as views of a memory mapping; a streaming writer.

Three things here are written by hand, each for a reason: the header check, so that a corrupt file
gets a message naming the file and the problem instead of a Rust panic string; the slice reader
(``MappedSafetensors``: views of a memory mapping, as ``safe_open`` gives, without its per-call Python
cost); and the writer, because ``safetensors.torch.save_file`` needs every tensor whole in memory,
while a merge produces tensors slice by slice and must stay bounded by the chunk size.
"""

from __future__ import annotations

import json
import math
import mmap
import struct
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ..lazy import torch
from ..errors import InputError
from .base import (CODE_OF_NAME, DTYPE_TABLE, INDEX_FILE, SINGLE_FILE, Checkpoint, TensorInfo, check_index_covers,
                   index_shards, read_config, torch_dtype)

MAX_HEADER_BYTES = 100 * 1024 * 1024


def read_header(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Return the tensors and ``__metadata__`` of one safetensors file, after checking the header.

    Raises ``InputError`` naming the file for a bad header length, bad JSON, an unknown dtype, a
    size that does not match the shape, or offsets outside the file.
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise InputError(f"{path}: not a safetensors file (only {size} bytes); re-download or re-save it")
            (n,) = struct.unpack("<Q", head)
            if n == 0 or n > MAX_HEADER_BYTES or 8 + n > size:
                raise InputError(
                    f"{path}: corrupt safetensors header (header length {n} does not fit a file of "
                    f"{size} bytes); the file is truncated or not safetensors — re-download it"
                )
            raw = f.read(n)
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror})") from None
    try:
        header = json.loads(raw)
        if not isinstance(header, dict):
            raise ValueError("not an object")
    except (ValueError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: corrupt safetensors header (invalid JSON: {e}); re-download it") from None
    data_size = size - 8 - n
    metadata = header.pop("__metadata__", None) or {}
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        try:
            dtype, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
            if not all(isinstance(d, int) and d >= 0 for d in shape):
                raise ValueError
        except (KeyError, TypeError, ValueError):
            raise InputError(f"{path}: corrupt safetensors header (bad entry for tensor {name!r})") from None
        if dtype not in DTYPE_TABLE:
            raise InputError(f"{path}: tensor {name!r} has dtype {dtype}, which RAM Desktop cannot read")
        info = TensorInfo(name, dtype, shape, path)
        if not (0 <= begin <= end <= data_size):
            raise InputError(
                f"{path}: tensor {name!r} has offsets {begin}..{end} outside the file's {data_size} data "
                "bytes; the file is truncated — re-download it"
            )
        if end - begin != info.nbytes:
            raise InputError(
                f"{path}: tensor {name!r} occupies {end - begin} bytes but {dtype}{list(shape)} needs "
                f"{info.nbytes}; the file is corrupt — re-download it"
            )
        tensors[name] = info
    return tensors, {str(k): str(v) for k, v in metadata.items()}


def weight_files(folder: Path) -> list[Path] | None:
    """The safetensors files of a model folder, or None when it has none (another format may apply)."""
    index = folder / INDEX_FILE
    if index.is_file():
        return index_shards(index)
    if (folder / SINGLE_FILE).is_file():
        return [folder / SINGLE_FILE]
    candidates = sorted(folder.glob("*.safetensors"))
    if len(candidates) == 1:
        return [candidates[0]]
    if len(candidates) > 1:
        raise InputError(
            f"{folder}: has {len(candidates)} .safetensors files but no {INDEX_FILE} saying how they form one "
            "model; point at one file or add the index"
        )
    return None


def open_folder(folder: Path, files: list[Path], spec: str) -> Checkpoint:
    """A model folder whose weights are ``files`` (from ``weight_files``): every header read and checked,
    and, when sharded, every tensor the index names found in the shard it names."""
    tensors: dict[str, TensorInfo] = {}
    metadata: dict[str, str] = {}
    for file in files:
        shard_tensors, shard_meta = read_header(file)
        for name in shard_tensors.keys() & tensors.keys():
            raise InputError(f"{folder}: tensor {name!r} appears in both {tensors[name].file.name} and {file.name}")
        tensors.update(shard_tensors)
        metadata.update(shard_meta)
    if (folder / INDEX_FILE).is_file():
        check_index_covers(folder / INDEX_FILE, tensors)
    return Checkpoint(spec, folder, files, tensors, read_config(folder), metadata=metadata)


def open_file(path: Path, spec: str) -> Checkpoint:
    """One ``.safetensors`` file (config and tokenizer, if any, from its folder)."""
    tensors, metadata = read_header(path)
    return Checkpoint(spec, path, [path], tensors, read_config(path.parent), metadata=metadata)


def open_slices(file: Path) -> "MappedSafetensors":
    """The file's slice reader (``get_slice(name)[a:b]``, ``get_tensor(name)``) as a context manager."""
    return MappedSafetensors(file)


class MappedSafetensors:
    """A safetensors file mapped into memory, read as views of the mapping: ``get_slice(name)[a:b]`` (rows
    a..b of a tensor) and ``get_tensor(name)``, in the stored dtype, without a copy (pages are read when
    the merge touches them).

    ``safe_open(...).get_slice`` gives the same views but costs ~50 µs of Python per call (torch's
    storage slicing): ~0.2 CPU-s per pass over a 300M-parameter set, much of it holding the GIL that the
    compute threads need. The mapping is private (copy-on-write): nothing writes to it, and no write could
    reach the file. Headers were checked when the checkpoint was opened (``read_header``).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        header.pop("__metadata__", None)
        start = 8 + n
        self._entries = {name: (e["dtype"], tuple(e["shape"]), start + e["data_offsets"][0])
                         for name, e in header.items()}

    def _span(self, name: str, first: int, last: int) -> tuple[str, tuple[int, ...], int, int]:
        """Rows first..last of a tensor: its dtype code, the slice's shape, element count and byte offset."""
        code, shape, begin = self._entries[name]
        row = math.prod(shape[1:]) if shape else 1
        rows = (max(first, 0), min(last, shape[0]) if shape else 1)
        count = max(0, rows[1] - rows[0]) * row
        out_shape = (max(0, rows[1] - rows[0]), *shape[1:]) if shape else ()
        return code, out_shape, count, begin + rows[0] * row * DTYPE_TABLE[code][1]

    def _rows(self, name: str, first: int, last: int) -> torch.Tensor:
        code, out_shape, count, offset = self._span(name, first, last)
        dtype = torch_dtype(DTYPE_TABLE[code][0])
        if count == 0:
            return torch.empty(out_shape, dtype=dtype)
        return torch.frombuffer(self._map, dtype=dtype, count=count, offset=offset).view(out_shape)

    def bits(self, name: str, first: int, last: int) -> np.ndarray:
        """Rows first..last of a tensor, flat, as a numpy view of its stored bits (``DTYPE_TABLE``: bfloat16 as
        uint16, float16 as int16): what the fused kernels read, without torch."""
        code, _, count, offset = self._span(name, first, last)
        bits_type = DTYPE_TABLE[code][2]
        if count == 0:
            return np.empty(0, bits_type)
        return np.frombuffer(self._map, dtype=bits_type, count=count, offset=offset)

    def get_slice(self, name: str) -> "_RowSlice":
        if name not in self._entries:
            raise KeyError(name)
        return _RowSlice(self, name)

    def get_tensor(self, name: str) -> torch.Tensor:
        shape = self._entries[name][1]
        return self._rows(name, 0, shape[0] if shape else 1)

    def keys(self) -> list[str]:
        return list(self._entries)

    def __enter__(self) -> "MappedSafetensors":
        return self

    def __exit__(self, *exc: object) -> None:
        # No close(): views hold a reference to the mapping but no buffer export, so closing it would
        # unmap memory under chunks still in flight. The mapping goes when its last view does.
        self._map = None


class _RowSlice:
    """``handle.get_slice(name)[a:b]``: rows a..b (a plain slice along dim 0) as a view."""

    def __init__(self, handle: MappedSafetensors, name: str) -> None:
        self._handle = handle
        self._name = name

    def get_shape(self) -> list[int]:
        return list(self._handle._entries[self._name][1])

    def __getitem__(self, key: slice) -> torch.Tensor:
        shape = self._handle._entries[self._name][1]
        if not isinstance(key, slice) or key.step not in (None, 1) or not shape:
            raise TypeError("row slices only: handle.get_slice(name)[a:b]")
        first, last, _ = key.indices(shape[0])
        return self._handle._rows(self._name, first, last)


class SafetensorsStreamWriter:
    """Writes one safetensors file whose tensors arrive in order, a slice at a time.

    The header is computed up front from names, dtypes and shapes; ``write`` appends raw bytes,
    and ``close`` checks that every tensor was written completely.
    """

    def __init__(self, path: Path, entries: list[tuple[str, str, tuple[int, ...]]], metadata: dict[str, str]) -> None:
        """``entries``: (tensor name, dtype name such as "bfloat16", shape) in the order they will be written."""
        header: dict[str, object] = {"__metadata__": metadata}
        offset = 0
        for name, dtype, shape in entries:
            code = CODE_OF_NAME[dtype]
            nbytes = math.prod(shape) * DTYPE_TABLE[code][1]
            header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        self.path = path
        self._expected = offset
        self._written = 0
        self._file: BinaryIO = open(path, "wb")
        self._file.write(struct.pack("<Q", len(raw)))
        self._file.write(raw)

    def write(self, data: torch.Tensor | np.ndarray) -> None:
        """Append the bytes of a CPU tensor or a numpy array of stored bits (the next slice of the current tensor)."""
        if isinstance(data, np.ndarray):
            buf = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        else:
            buf = data.contiguous().view(-1).view(torch.uint8).numpy()
        self._file.write(memoryview(buf))
        self._written += buf.nbytes

    def close(self) -> None:
        self._file.close()
        if self._written != self._expected:
            raise RuntimeError(f"{self.path}: wrote {self._written} of {self._expected} bytes")

    def abort(self) -> None:
        self._file.close()
