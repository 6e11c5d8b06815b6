"""Turn what the user named into a ``Checkpoint``: files, tensor table, config. No tensor data is read."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .errors import InputError
from .events import Reporter
from .safetensors_io import TensorInfo, read_header

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
HUB_ID = re.compile(r"^(?:hf://)?[A-Za-z0-9][\w.-]*/[\w.-]+(?:@[\w./-]+)?$")


@dataclass
class Checkpoint:
    """A base model or an agent, resolved to local files and read as far as its headers."""

    spec: str  # what the user typed
    path: Path  # local folder, or the single .safetensors file
    files: list[Path]
    tensors: dict[str, TensorInfo]
    config: dict | None = None
    revision: str | None = None  # resolved Hub commit, when the source came from the Hub
    repo_id: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)

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


def open_checkpoint(spec: str | Path, reporter: Reporter | None = None, token: str | None = None) -> Checkpoint:
    """Resolve a local folder, a ``.safetensors`` file, or a Hub id (``org/name[@rev]``, ``hf://...``).

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


def open_local(path: Path, spec: str | None = None) -> Checkpoint:
    """Open a local model folder (Hugging Face layout, single or sharded) or one ``.safetensors`` file."""
    path = path.resolve()
    spec = spec or str(path)
    if path.is_file():
        if path.suffix == ".safetensors":
            tensors, metadata = read_header(path)
            return Checkpoint(spec, path, [path], tensors, _read_config(path.parent), metadata=metadata)
        if path.suffix in PICKLE_SUFFIXES:
            from .pickle_io import open_pickle_file

            return open_pickle_file(path, spec)
        raise InputError(f"{path}: not a .safetensors file or a model folder")
    files = _weight_files(path)
    if files is None:
        from .pickle_io import open_pickle_folder

        return open_pickle_folder(path, spec)
    tensors: dict[str, TensorInfo] = {}
    metadata: dict[str, str] = {}
    for file in files:
        shard_tensors, shard_meta = read_header(file)
        for name in shard_tensors.keys() & tensors.keys():
            raise InputError(f"{path}: tensor {name!r} appears in both {tensors[name].file.name} and {file.name}")
        tensors.update(shard_tensors)
        metadata.update(shard_meta)
    return Checkpoint(spec, path, files, tensors, _read_config(path), metadata=metadata)


def _weight_files(folder: Path) -> list[Path] | None:
    """The safetensors files of a model folder, or None when it has none (pickle formats may apply)."""
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            names = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise InputError(f"{index}: not a valid index (needs a JSON object with a \"weight_map\")") from None
        files = []
        for name in names:
            # Containment is checked on the path as written, so that shards which are symlinks (the
            # Hugging Face cache links snapshot files to blobs/) are accepted, while "../x" is not.
            if not contained(folder, name):
                raise InputError(f"{index}: names {name!r}, which is outside the model folder; refusing to read it")
            file = folder / os.path.normpath(name)  # not resolved: errors name the file, not a cache blob
            if not file.is_file():
                raise InputError(f"{index}: names shard {name!r}, which is missing from {folder}; re-download it")
            files.append(file)
        return files
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


def contained(folder: Path, name: str) -> bool:
    """Whether ``folder / name`` stays inside ``folder`` as written (no absolute path, no ``..`` escape)."""
    if os.path.isabs(name):
        return False
    norm = os.path.normpath(os.path.join(str(folder), name))
    return os.path.commonpath([norm, os.path.normpath(str(folder))]) == os.path.normpath(str(folder)) and norm != os.path.normpath(str(folder))


def _read_config(folder: Path) -> dict | None:
    config = folder / "config.json"
    if not config.is_file():
        return None
    try:
        value = json.loads(config.read_text())
        return value if isinstance(value, dict) else None
    except ValueError:
        raise InputError(f"{config}: invalid JSON; fix or remove it") from None
