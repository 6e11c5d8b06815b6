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
import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import numpy as np

from ...errors import InputError
from ...lazy import torch
from ..safe_read import json_depth, open_regular, os_reason, parse_json
from .base import (
    CODE_OF_NAME,
    DTYPE_TABLE,
    INDEX_FILE,
    SINGLE_FILE,
    Checkpoint,
    TensorInfo,
    WeightFormat,
    check_index_covers,
    content_hasher,
    index_shards,
    read_config,
    remember_written_digest,
    torch_dtype,
)

if TYPE_CHECKING:
    from typing_extensions import Self

MAX_HEADER_BYTES = 100_000_000  # the safetensors library's limit (MAX_HEADER_SIZE)
HEADER_MAX_DEPTH = 127  # serde_json, which the library parses headers with, refuses a 128th level of nesting
_JSON_SPACE = b" \t\r\n"
_ENTRY_KEYS = frozenset({"dtype", "shape", "data_offsets"})


@dataclass(frozen=True)
class Header:
    """One safetensors file's validated header: its tensors, ``__metadata__``, where the data buffer starts
    in the file and, per tensor, its byte range in that buffer. ``identity`` is the file's
    (device, inode, size, mtime) when it was read: ``MappedSafetensors`` reuses the header only for that file."""

    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    data_start: int
    offsets: dict[str, tuple[int, int]]
    identity: tuple[int, int, int, int]


_HEADERS: dict[str, Header] = {}  # by path: the last validated header of each file (MappedSafetensors reuses it)
_HEADERS_KEPT = 1024
_HEADERS_LOCK = threading.Lock()


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def read_header(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Return the tensors and ``__metadata__`` of one safetensors file, after checking the header.

    Raises ``InputError`` naming the file (and the tensor) for anything the safetensors library refuses
    (see ``_parse_header``) and for a dtype RAM Desktop cannot read; a FIFO, device or folder is refused
    before anything is read from it.
    """
    path = Path(path)
    with open_regular(path) as f:
        header = _parse_header(f, path)
    _remember(path, header)
    return dict(header.tensors), dict(header.metadata)  # copies: callers may edit theirs, the kept one stays


def _remember(path: Path, header: Header) -> None:
    with _HEADERS_LOCK:  # headers are read from worker threads too
        while len(_HEADERS) >= _HEADERS_KEPT:
            _HEADERS.pop(next(iter(_HEADERS)))
        _HEADERS[str(path)] = header


def _parse_header(f: BinaryIO, path: Path) -> Header:
    """Read and validate the header of the open safetensors file ``f`` as strictly as the safetensors
    library (0.8) does, with a message naming the file and the tensor instead of its error code.

    Refused, as the library refuses them: a header length of 0, over 100 MB or past the end of the file;
    a header that is not UTF-8, does not start with ``{`` (after JSON whitespace), is not JSON, or nests
    128 levels deep; NaN, Infinity or out-of-range numbers; ``__metadata__`` that is not an object of
    strings; a tensor entry that is not an object, a ``dtype`` that is not a string, a ``shape`` that is
    not a list of non-negative integers, ``data_offsets`` that are not two non-negative integers with
    begin <= end (booleans and floats are not integers); a byte size that does not match dtype and shape;
    tensors that do not tile the data buffer: sorted by offsets, each must begin where the previous one
    ended, the first at 0 and the last ending at the end of the file (no overlap, gap or trailing byte;
    empty tensors are allowed).
    Refused although the library accepts them (they make the file ambiguous): a tensor name or
    metadata key that appears twice (the library keeps the last one), and a tensor entry written as a
    list instead of an object. Accepted as the library does: extra keys in a tensor entry,
    ``"__metadata__": null``, a file with no tensors.
    """
    try:
        st = os.fstat(f.fileno())
        size, identity = st.st_size, _identity(st)
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
        raise InputError(f"{path}: cannot read ({os_reason(e)})") from None
    if len(raw) < n:
        raise InputError(
            f"{path}: corrupt safetensors header (the file ended inside it); the file is truncated — re-download it"
        )
    corrupt = f"{path}: corrupt safetensors header"
    if raw.lstrip(_JSON_SPACE)[:1] != b"{":
        raise InputError(f"{corrupt} (it does not start with '{{'); the file is not safetensors — re-download it")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{corrupt} (not UTF-8 at byte {e.start}); re-download it") from None
    # nesting: checked below, where it can be deeper than the header's own 3 levels (extra keys of an entry)
    header = parse_json(text, f"{path}: invalid JSON in the safetensors header", max_depth=None, finite=True)
    if not isinstance(header, dict):  # unreachable after the '{' check and a full parse; kept for the type
        raise InputError(f"{corrupt} (not a JSON object); re-download it")
    metadata = header.pop("__metadata__", None)
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise InputError(
            f"{corrupt} (__metadata__ is {_json_kind(metadata)}, not an object of strings); re-download or re-save it"
        )
    for key, value in metadata.items():
        if not isinstance(value, str):
            raise InputError(
                f"{corrupt} (__metadata__ {key!r} is {_json_kind(value)}, not a string); re-download or re-save it"
            )
    data_size = size - 8 - n
    tensors: dict[str, TensorInfo] = {}
    offsets: dict[str, tuple[int, int]] = {}
    for name, entry in header.items():
        dtype, shape, span = (
            (entry.get("dtype"), entry.get("shape"), entry.get("data_offsets"))
            if type(entry) is dict
            else (None, None, None)
        )
        if (
            type(dtype) is not str
            or type(shape) is not list
            or type(span) is not list
            or len(span) != 2
            or type(span[0]) is not int
            or type(span[1]) is not int
            or not 0 <= span[0] <= span[1]
            or not all(type(d) is int and d >= 0 for d in shape)
        ):
            raise _bad_entry(corrupt, name, entry)  # the precise message, built only for a bad entry
        if len(entry) > 3:  # extra keys: allowed (as by the library), nested up to its limit
            for key, value in entry.items():
                if key not in _ENTRY_KEYS and 2 + json_depth(value) > HEADER_MAX_DEPTH:
                    raise InputError(
                        f"{path}: invalid JSON in the safetensors header: JSON nested too deeply "
                        f"(more than {HEADER_MAX_DEPTH} levels, in tensor {name!r})"
                    )
        if dtype not in DTYPE_TABLE:
            raise InputError(f"{path}: tensor {name!r} has dtype {dtype}, which RAM Desktop cannot read")
        begin, end = span
        info = TensorInfo(name, dtype, tuple(shape), path)
        if end > data_size:
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
        offsets[name] = (begin, end)
    _check_tiling(path, offsets, data_size)
    return Header(tensors, metadata, 8 + n, offsets, identity)


def _bad_entry(corrupt: str, name: str, entry: object) -> InputError:
    """What is wrong with a tensor's header entry that failed the quick check in ``_parse_header``."""
    where = f"{corrupt} (tensor {name!r}"
    if not isinstance(entry, dict):
        return InputError(
            f"{where} is {_json_kind(entry)}, not an object with dtype, shape and data_offsets); re-download it"
        )
    missing = [key for key in ("dtype", "shape", "data_offsets") if key not in entry]
    if missing:
        return InputError(f"{where} has no {', '.join(missing)}); re-download it")
    dtype, shape, span = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str):
        return InputError(f"{where}: dtype is {_json_kind(dtype)}, not a string); re-download it")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        return InputError(f"{where}: shape {json.dumps(shape)} is not a list of non-negative integers); re-download it")
    return InputError(
        f"{where}: data_offsets {json.dumps(span)} are not two non-negative integers begin <= end); re-download it"
    )


def _check_tiling(path: Path, offsets: dict[str, tuple[int, int]], data_size: int) -> None:
    """The tensors' byte ranges, in offset order, cover the data buffer exactly once (the library's rule)."""
    expected, previous = 0, None
    for name, (begin, end) in sorted(offsets.items(), key=lambda item: item[1]):
        if begin < expected:
            raise InputError(
                f"{path}: tensors {previous!r} and {name!r} overlap (bytes {begin}..{expected}); "
                "the file is corrupt — re-download it"
            )
        if begin > expected:
            raise InputError(
                f"{path}: bytes {expected}..{begin} before tensor {name!r} belong to no tensor; "
                "the file is corrupt — re-download it"
            )
        expected, previous = end, name
    if expected != data_size:
        after = f", after tensor {previous!r}," if previous is not None else ""
        raise InputError(
            f"{path}: the last {data_size - expected} bytes of the file{after} belong to no tensor; "
            "the file is corrupt — re-download it"
        )


def _json_kind(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    return {
        dict: "an object",
        list: "a list",
        str: "a string",
        int: "a number",
        float: "a number",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def weight_files(folder: Path) -> list[Path] | None:
    """The safetensors files of a model folder, or None when it has none (another format may apply)."""
    index = folder / INDEX_FILE
    if index.exists():  # exists, not is_file: a FIFO or folder of that name is refused by its reader, not skipped
        return index_shards(index)
    if (folder / SINGLE_FILE).exists():
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
    if (folder / INDEX_FILE).exists():
        check_index_covers(folder / INDEX_FILE, tensors)
    return Checkpoint(spec, folder, files, tensors, read_config(folder), metadata=metadata)


def open_file(path: Path, spec: str) -> Checkpoint:
    """One ``.safetensors`` file (config and tokenizer, if any, from its folder)."""
    tensors, metadata = read_header(path)
    return Checkpoint(spec, path, [path], tensors, read_config(path.parent), metadata=metadata)


def open_slices(file: Path) -> MappedSafetensors:
    """The file's slice reader (``get_slice(name)[a:b]``, ``get_tensor(name)``) as a context manager."""
    return MappedSafetensors(file)


class MappedSafetensors:
    """A safetensors file mapped into memory, read as views of the mapping: ``get_slice(name)[a:b]`` (rows
    a..b of a tensor) and ``get_tensor(name)``, in the stored dtype, without a copy (pages are read when
    the merge touches them).

    ``safe_open(...).get_slice`` gives the same views but costs ~50 µs of Python per call (torch's
    storage slicing): ~0.2 CPU-s per pass over a 300M-parameter set, much of it holding the GIL that the
    compute threads need. The mapping is private (copy-on-write): nothing writes to it, and no write could
    reach the file. The header is the one ``read_header`` validated when the checkpoint was opened (validated
    again if the file changed since).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        with open_regular(path) as f:
            header = _HEADERS.get(str(path))
            if header is None or header.identity != _identity(os.fstat(f.fileno())):
                header = _parse_header(f, path)  # not read yet, or changed since: validated again
                _remember(path, header)
            try:
                self._map: mmap.mmap | None = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
            except OSError as e:
                raise InputError(f"{path}: cannot read ({os_reason(e)})") from None
        start = header.data_start
        self._entries = {
            name: (info.dtype, info.shape, start + header.offsets[name][0]) for name, info in header.tensors.items()
        }

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
        assert self._map is not None, "read after the handle was closed"
        return torch.frombuffer(self._map, dtype=dtype, count=count, offset=offset).view(out_shape)

    def bits(self, name: str, first: int, last: int) -> np.ndarray:
        """Rows first..last of a tensor, flat, as a numpy view of its stored bits (``DTYPE_TABLE``: bfloat16 as
        uint16, float16 as int16): what the fused kernels read, without torch."""
        code, _, count, offset = self._span(name, first, last)
        bits_type = DTYPE_TABLE[code][2]
        if count == 0:
            return np.empty(0, bits_type)
        assert self._map is not None, "read after the handle was closed"
        return np.frombuffer(self._map, dtype=bits_type, count=count, offset=offset)

    def get_slice(self, name: str) -> _RowSlice:
        if name not in self._entries:
            raise KeyError(name)
        return _RowSlice(self, name)

    def get_tensor(self, name: str) -> torch.Tensor:
        shape = self._entries[name][1]
        return self._rows(name, 0, shape[0] if shape else 1)

    def keys(self) -> list[str]:
        return list(self._entries)

    def __enter__(self) -> Self:
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


def stored_bytes(data: torch.Tensor | np.ndarray) -> np.ndarray:
    """The bytes a slice is stored as (a CPU tensor's, or a numpy array of stored bits), as a flat uint8 view: what
    the shard writer writes and the in-memory sink keeps (``output.MemoryShards``)."""
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    return data.contiguous().view(-1).view(torch.uint8).numpy()


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
        self._file: BinaryIO = open(path, "wb")  # noqa: SIM115  the writer owns it until close()
        self._digest = content_hasher()  # of every byte written, for the output's manifest
        for part in (struct.pack("<Q", len(raw)), raw):
            self._file.write(part)
            self._digest.update(part)

    def write(self, data: torch.Tensor | np.ndarray) -> None:
        """Append the bytes of a CPU tensor or a numpy array of stored bits (the next slice of the current tensor)."""
        buf = stored_bytes(data)
        self._file.write(buf.data)
        self._digest.update(buf.data)  # releases the GIL: hashed in the writer thread beside the merge
        self._written += buf.nbytes

    def close(self) -> None:
        self._file.close()
        if self._written != self._expected:
            raise RuntimeError(f"{self.path}: wrote {self._written} of {self._expected} bytes")
        remember_written_digest(self.path, self._digest.hexdigest())

    def abort(self) -> None:
        self._file.close()


def pick(names: list[str]) -> list[str] | None:
    """Of a repository's root file names, the safetensors weights to download: the index (its shards are added
    once it is read), ``model.safetensors``, or a single ``*.safetensors``; None when there are none."""
    root = [n for n in names if "/" not in n]
    if INDEX_FILE in root:
        return [INDEX_FILE]
    if SINGLE_FILE in root:
        return [SINGLE_FILE]
    candidates = [n for n in root if n.endswith(".safetensors")]
    return candidates if len(candidates) == 1 else None


def _open_folder(folder: Path, spec: str) -> Checkpoint | None:
    files = weight_files(folder)
    return open_folder(folder, files, spec) if files is not None else None


FORMAT = WeightFormat(
    "safetensors",
    "safetensors",
    (".safetensors",),
    (SINGLE_FILE, INDEX_FILE),
    pick,
    _open_folder,
    open_file,
    open_slices,
)
